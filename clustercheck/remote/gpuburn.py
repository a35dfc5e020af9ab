"""Every GPU of the node under load at once for a given length, watched (plain torch; Python 3.8+).

    gpuburn --seconds S [--matmul-n N] [--interval I]

One thread per CUDA GPU multiplies dense N x N bf16 matrices (`torch.mm`) back to back for S seconds, every GPU at
once, while the main thread samples every GPU with nvidia-smi every I seconds (its SM clock and maximum SM clock,
temperature, power draw and limit, the active clocks-event (throttle) reasons' bitmask, the volatile ECC error
counts and the memory used: QUERY; drivers before r535 name the reasons clocks_throttle_reasons.*, and OLD_QUERY asks
for them so). A sample where nvidia-smi exits non-zero keeps the lines it printed (the GPUs it could read) with its
error ("error" beside "lines"), so that one inaccessible GPU is named and the others' samples kept. The kernel log's
Xid lines are read before and after the load (journalctl -k -b, else dmesg: facts.xid_lines).

Each GPU's load runs on its own clock: its thread records when its load began ("load_began": seconds on the
samples' clock, once its first multiply has completed) and ended ("load_ended"), so that the controller judges the
samples taken under load on that GPU, not those taken while eight contexts were still starting. The program waits
for the threads at most START_GRACE + S + FINISH_GRACE seconds (gputhreads.run_each): a GPU that has not finished is
named with what it was doing ("hung": true, "phase"), the others' answers kept.

The load checks its own results while it runs: its inputs are made from a fixed seed (LOAD_SEED, torch's generator
on the device, the same numbers on every GPU of one torch), so every GPU of one model computes the same product; the
SHA-256 of its first product is "load_hash" (compared across the node's GPUs of a model), and about every
CHECK_EVERY seconds, and at the end, the product is compared with that first one on the GPU ("load_checks",
"load_mismatches"): a GPU whose product changes under load, heat or power computes wrongly.

Before and after the load, each GPU also runs one fixed computation (FIXED: the same seeded inputs, made on the CPU,
the same sequence of float32 multiplies with TF32 off and torch's deterministic algorithms) and reports the SHA-256
of its result's bytes: GPUs of one model with one torch and CUDA give the same bytes, so a GPU whose hash differs
from its peers', or from its own before the load, computed wrongly (silent data corruption).

The answer, one JSON object on the last line: {"cuda": true, "torch", "cuda_version", "seconds", "matmul_n",
"fixed": {steps, n, seed}, "load_seed", "gpus": [{index, bus_id, name, load_began, load_ended, iterations, tflops,
seconds, hash_before, hash_after, load_hash, load_checks, load_mismatches} or {..., error, phase} or {..., hung: true,
phase}], "smi": {"fields": [...], "samples": [{"t": seconds since the program's start, "lines": [CSV lines],
"error"?}]} or {"error"}, "xids": {"source", "before": [lines], "after": [lines]} or {"error"}}; without a CUDA GPU
{"cuda": false, "reason": why, "gpus": []}: data, never an exception. The controller parses the samples
(facts/burn.py) and judges them (checks/gpuburn.py).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import threading
import time

from .facts import xid_lines
from .gpubench import bus_id, no_cuda, set_tf32
from .gputhreads import error_text, leave, run_each
from .probing import run as run_command

QUERY = (
    "index",
    "pci.bus_id",
    "clocks.sm",
    "clocks.max.sm",
    "temperature.gpu",
    "power.draw",
    "power.limit",
    "clocks_event_reasons.active",
    "ecc.errors.corrected.volatile.total",
    "ecc.errors.uncorrected.volatile.total",
    "memory.used",
)
OLD_QUERY = tuple(f.replace("clocks_event_reasons.", "clocks_throttle_reasons.") for f in QUERY)
FIXED = {"steps": 8, "n": 1024, "seed": 20260101}  # the fixed computation: its multiplies, their side, the seed
LOAD_SEED = 20260102  # the load's inputs: the same on every GPU, so the same product
CHECK_EVERY = 10.0  # seconds between two comparisons of the load's product with its first
START_GRACE = 60.0  # seconds a GPU has to start its load (its context, the fixed computation, the allocation)
FINISH_GRACE = 30.0  # seconds after the load for the fixed computation and the answer
MAX_SAMPLES = 600  # a long load is sampled less often than every I seconds, so the answer stays small
SMI_TIMEOUT = 10.0


def sample(fields: tuple[str, ...]) -> dict:
    """One nvidia-smi query of FIELDS for every GPU: {"lines": [...]} or the failure ({"error"})."""
    argv = ["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"]
    answer = run_command(argv, SMI_TIMEOUT)
    if "error" in answer:
        return answer
    lines = [line.strip() for line in answer["out"].splitlines() if line.strip()]
    if answer["rc"] != 0:
        said = (answer["err"] or answer["out"]).strip().splitlines()
        error = f"nvidia-smi exit {answer['rc']}" + (f": {said[-1]}" if said else "")
        errors = [line.strip() for line in answer["err"].splitlines() if line.strip()]
        # the GPUs it could read are kept beside the error (a line naming one GPU it could not read among them)
        return {"lines": lines + errors, "error": error} if lines else {"error": error}
    return {"lines": lines}


def first_fields() -> tuple[tuple[str, ...] | None, str | None]:
    """The field names this driver takes (QUERY, else the older OLD_QUERY), or why neither answers."""
    errors = []
    for fields in (QUERY, OLD_QUERY):
        answer = sample(fields)
        if "lines" in answer:
            return fields, None
        errors.append(answer["error"])
        if "Field" not in answer["error"] and "field" not in answer["error"]:
            break  # not a field this driver lacks: the older names will not answer either
    return None, "; ".join(dict.fromkeys(errors))


class Sampler(threading.Thread):
    """nvidia-smi every INTERVAL seconds while the load runs (until `stop`), each sample's lines with its time."""

    def __init__(self, fields: tuple[str, ...], interval: float, began: float) -> None:
        super().__init__(daemon=True)
        self.fields = fields
        self.interval = interval
        self.began = began
        self.samples: list[dict] = []
        self.errors: list[str] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            at = time.monotonic()
            answer = sample(self.fields)
            if "lines" in answer:
                kept = {"t": round(at - self.began, 2), "lines": answer["lines"]}
                self.samples.append({**kept, "error": answer["error"]} if "error" in answer else kept)
            else:
                self.errors.append(answer["error"])
            self.done.wait(max(0.0, self.interval - (time.monotonic() - at)))

    def stop(self) -> dict:
        self.done.set()
        self.join(timeout=SMI_TIMEOUT + 5)
        out: dict = {"fields": list(self.fields), "samples": self.samples}
        if self.errors:
            out["errors"] = sorted(set(self.errors))[:5]
        return out


def fixed_hash(torch, device) -> str:
    """SHA-256 of the fixed computation's result on DEVICE (FIXED: seeded inputs made on the CPU, float32 multiplies,
    TF32 off and deterministic algorithms set by the caller)."""
    n = FIXED["n"]
    generator = torch.Generator().manual_seed(FIXED["seed"])
    a = torch.randn(n, n, generator=generator, dtype=torch.float32).to(device)
    b = torch.randn(n, n, generator=generator, dtype=torch.float32).to(device)
    for _ in range(FIXED["steps"]):
        a = torch.tanh(torch.mm(a, b) / n**0.5)
    result = a.contiguous().cpu()
    try:
        data = result.numpy().tobytes()
    except RuntimeError:  # torch without numpy: the values written out exactly instead of their bytes
        data = repr(result.tolist()).encode()
    return hashlib.sha256(data).hexdigest()


def digest(torch, tensor) -> str:
    """SHA-256 of TENSOR's bytes (a bf16 tensor read as 16-bit integers: numpy has no bf16)."""
    data = tensor.contiguous().view(torch.int16).cpu() if tensor.dtype == torch.bfloat16 else tensor.cpu()
    try:
        raw = data.numpy().tobytes()
    except (RuntimeError, TypeError):  # torch without numpy
        raw = repr(data.tolist()).encode()
    return hashlib.sha256(raw).hexdigest()


def seeded(torch, device, n: int):
    """The load's two N x N bf16 inputs, from LOAD_SEED with torch's generator on DEVICE."""
    generator = torch.Generator(device=device).manual_seed(LOAD_SEED)
    return tuple(torch.randn(n, n, generator=generator, device=device, dtype=torch.bfloat16) for _ in range(2))


def load(torch, device, n: int, seconds: float, entry: dict, began: float | None = None) -> None:
    """Dense bf16 multiplies on DEVICE back to back for SECONDS, into ENTRY: the fixed computation's hash before and
    after, when the load began and ended (seconds since BEGAN, the samples' clock), the multiplies done and their
    TFLOP/s, the product's hash and its comparisons with the first. ENTRY's "phase" says what runs; a failure is
    ENTRY's "error" in that phase (the other devices go on)."""
    began = time.monotonic() if began is None else began
    start_of_all = time.perf_counter()
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    try:
        entry["phase"] = "fixed computation before the load"
        entry["hash_before"] = fixed_hash(torch, device)
        entry["phase"] = "allocating the load's matrices"
        a, b = seeded(torch, device, n)
        out = torch.empty(n, n, device=device, dtype=torch.bfloat16)
        entry["phase"] = "first multiply"
        torch.mm(a, b, out=out)
        sync()
        first = out.clone()
        entry["load_hash"] = digest(torch, first)
        entry["load_began"] = round(time.monotonic() - began, 2)
        entry["phase"] = "load"
        _, checks, mismatches = _multiply(torch, a, b, out, first, seconds, sync, entry)
        entry["load_ended"] = round(time.monotonic() - began, 2)
        entry["load_checks"], entry["load_mismatches"] = checks, mismatches
        entry["phase"] = "fixed computation after the load"
        entry["hash_after"] = fixed_hash(torch, device)
        entry["phase"] = "done"
    except Exception as exc:  # the device's own failure is its answer
        entry["error"] = error_text(exc)
    entry["seconds"] = round(time.perf_counter() - start_of_all, 3)


def _multiply(torch, a, b, out, first, seconds: float, sync, entry: dict) -> tuple[int, int, int]:
    """A @ B into OUT back to back for SECONDS, OUT compared with FIRST about every CHECK_EVERY seconds and at the
    end; ENTRY gets the multiplies' count and TFLOP/s. Returns (multiplies, comparisons, mismatches)."""
    n = a.shape[0]
    iterations, checks, mismatches = 0, 0, 0
    start = time.perf_counter()
    next_check = start + CHECK_EVERY
    while time.perf_counter() - start < seconds:
        for _ in range(8):
            torch.mm(a, b, out=out)
        iterations += 8
        sync()
        if time.perf_counter() >= next_check:
            checks, mismatches = checks + 1, mismatches + (not torch.equal(out, first))
            next_check += CHECK_EVERY
    took = time.perf_counter() - start
    checks, mismatches = checks + 1, mismatches + (not torch.equal(out, first))
    entry["iterations"] = iterations
    entry["tflops"] = float(f"{2 * n**3 * iterations / took / 1e12:.4g}")
    return iterations, checks, mismatches


def gpu_thread(torch, n: int, seconds: float, began: float, index: int, entry: dict) -> None:
    """GPU INDEX loaded into ENTRY: its bus id and name, then the load (load)."""
    try:
        entry["bus_id"] = bus_id(torch, index)
        entry["name"] = torch.cuda.get_device_name(index)
        torch.cuda.set_device(index)
    except Exception as exc:
        entry["error"] = error_text(exc)
        return
    load(torch, torch.device("cuda", index), n, seconds, entry, began)


def deterministic(torch) -> None:
    """The settings the fixed computation needs to give the same bytes every time: TF32 off (torch's fp32_precision
    where it has it, the older allow_tf32 flags before it: gpubench.set_tf32), deterministic algorithms (cuBLAS needs
    CUBLAS_WORKSPACE_CONFIG for them, set before CUDA starts)."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    set_tf32(torch, False)
    cudnn = torch.backends.cudnn
    if hasattr(cudnn, "fp32_precision"):
        cudnn.fp32_precision = "ieee"
    else:
        cudnn.allow_tf32 = False
    torch.use_deterministic_algorithms(True)


def kernel_xids() -> dict:
    answer = xid_lines(30.0)
    return {"error": answer["error"]} if "error" in answer else {"source": answer["source"], "lines": answer["lines"]}


def run(seconds: float, n: int, interval: float) -> tuple[dict, list[int]]:
    """The answer, and the GPUs whose thread had not finished in time (hung)."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import torch

    reason = no_cuda(torch)
    if reason is not None:
        return {"cuda": False, "reason": reason, "gpus": [], "torch": torch.__version__}, []
    deterministic(torch)
    before = kernel_xids()
    fields, smi_error = first_fields()
    began = time.monotonic()
    sampler = Sampler(fields, max(interval, seconds / MAX_SAMPLES), began) if fields else None
    if sampler:
        sampler.start()
    count = torch.cuda.device_count()
    deadline = START_GRACE + seconds + FINISH_GRACE
    out, hung = run_each(count, lambda i, entry: gpu_thread(torch, n, seconds, began, i, entry), deadline)
    smi = sampler.stop() if sampler else {"error": smi_error}
    after = kernel_xids()
    if "error" in before or "error" in after:
        xids = {"error": before.get("error") or after.get("error")}
    else:
        xids = {"source": after["source"], "before": before["lines"], "after": after["lines"]}
    answer = {
        "cuda": True,
        "torch": torch.__version__,
        "cuda_version": torch.version.cuda,
        "seconds": seconds,
        "matmul_n": n,
        "fixed": FIXED,
        "load_seed": LOAD_SEED,
        "gpus": [out[i] for i in sorted(out)],
        "smi": smi,
        "xids": xids,
    }
    return answer, hung


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpuburn", description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, required=True, help="how long every GPU is under load")
    parser.add_argument("--matmul-n", type=int, default=8192, help="the multiplied matrices' side")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between nvidia-smi samples")
    args = parser.parse_args(argv)
    if args.seconds <= 0 or args.matmul_n < 1 or args.interval <= 0:
        parser.error("--seconds, --matmul-n and --interval must be positive")
    answer, hung = run(args.seconds, args.matmul_n, args.interval)
    return leave(json.dumps(answer), hung)


if __name__ == "__main__":
    raise SystemExit(main())
