"""Every GPU of the node under load at once for a given length, watched (plain torch; Python 3.8+).

    gpuburn --seconds S [--matmul-n N] [--interval I]

One thread per CUDA GPU multiplies dense N x N bf16 matrices (`torch.mm`) back to back for S seconds, every GPU at
once, while the main thread samples every GPU with nvidia-smi every I seconds (its SM clock and maximum SM clock,
temperature, power draw and limit, the active clocks-event (throttle) reasons' bitmask and the volatile ECC error
counts: QUERY; drivers before r535 name the reasons clocks_throttle_reasons.*, and OLD_QUERY asks for them so). The
kernel log's Xid lines are read before and after the load (journalctl -k -b, else dmesg: facts.xid_lines).

Before and after the load, each GPU also runs one fixed computation (FIXED: the same seeded inputs, made on the CPU,
the same sequence of float32 multiplies with TF32 off and torch's deterministic algorithms) and reports the SHA-256
of its result's bytes: GPUs of one model with one torch and CUDA give the same bytes, so a GPU whose hash differs
from its peers', or from its own before the load, computed wrongly (silent data corruption).

The answer, one JSON object on the last line: {"cuda": true, "torch", "cuda_version", "seconds", "matmul_n",
"fixed": {steps, n, seed}, "gpus": [{index, bus_id, name, iterations, tflops, seconds, hash_before, hash_after} or
{..., error}], "smi": {"fields": [...], "samples": [{"t": seconds into the load, "lines": [CSV lines]}]} or {"error"},
"xids": {"source", "before": [lines], "after": [lines]} or {"error"}}; without a CUDA GPU {"cuda": false, "reason":
why, "gpus": []}: data, never an exception. The controller parses the samples (facts/burn.py) and judges them
(checks/gpuburn.py).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import threading
import time

from .facts import xid_lines
from .gpubench import bus_id, error_text, no_cuda
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
)
OLD_QUERY = tuple(f.replace("clocks_event_reasons.", "clocks_throttle_reasons.") for f in QUERY)
FIXED = {"steps": 8, "n": 1024, "seed": 20260101}  # the fixed computation: its multiplies, their side, the seed
MAX_SAMPLES = 600  # a long load is sampled less often than every I seconds, so the answer stays small
SMI_TIMEOUT = 10.0


def sample(fields: tuple[str, ...]) -> dict:
    """One nvidia-smi query of FIELDS for every GPU: {"lines": [...]} or the failure ({"error"})."""
    argv = ["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"]
    answer = run_command(argv, SMI_TIMEOUT)
    if "error" in answer:
        return answer
    if answer["rc"] != 0:
        said = (answer["err"] or answer["out"]).strip().splitlines()
        return {"error": f"nvidia-smi exit {answer['rc']}" + (f": {said[-1]}" if said else "")}
    return {"lines": [line.strip() for line in answer["out"].splitlines() if line.strip()]}


def first_fields() -> tuple[tuple[str, ...] | None, str | None]:
    """The field names this driver takes (QUERY, else the older OLD_QUERY), or why neither answers."""
    errors = []
    for fields in (QUERY, OLD_QUERY):
        answer = sample(fields)
        if "lines" in answer:
            return fields, None
        errors.append(answer["error"])
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
                self.samples.append({"t": round(at - self.began, 2), "lines": answer["lines"]})
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


def load(torch, device, n: int, seconds: float, entry: dict) -> None:
    """Dense bf16 multiplies on DEVICE back to back for SECONDS, into ENTRY: the fixed computation's hash before and
    after, the multiplies done and their TFLOP/s. A failure is ENTRY's "error" (the other devices go on)."""
    began = time.perf_counter()
    try:
        entry["hash_before"] = fixed_hash(torch, device)
        a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
        b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
        out = torch.empty(n, n, device=device, dtype=torch.bfloat16)
        iterations, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            for _ in range(8):
                torch.mm(a, b, out=out)
            iterations += 8
            if device.type == "cuda":
                torch.cuda.synchronize(device)
        took = time.perf_counter() - start
        entry["iterations"] = iterations
        entry["tflops"] = float(f"{2 * n**3 * iterations / took / 1e12:.4g}")
        entry["hash_after"] = fixed_hash(torch, device)
    except Exception as exc:  # the device's own failure is its answer
        entry["error"] = error_text(exc)
    entry["seconds"] = round(time.perf_counter() - began, 3)


def gpu_thread(torch, index: int, n: int, seconds: float, out: dict) -> None:
    entry: dict = {"index": index, "bus_id": None, "name": None}
    out[index] = entry
    try:
        entry["bus_id"] = bus_id(torch, index)
        entry["name"] = torch.cuda.get_device_name(index)
        torch.cuda.set_device(index)
    except Exception as exc:
        entry["error"] = error_text(exc)
        return
    load(torch, torch.device("cuda", index), n, seconds, entry)


def deterministic(torch) -> None:
    """The settings the fixed computation needs to give the same bytes every time: TF32 off, deterministic
    algorithms (cuBLAS needs CUBLAS_WORKSPACE_CONFIG for them, set before CUDA starts)."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.use_deterministic_algorithms(True)


def kernel_xids() -> dict:
    answer = xid_lines(30.0)
    return {"error": answer["error"]} if "error" in answer else {"source": answer["source"], "lines": answer["lines"]}


def run(seconds: float, n: int, interval: float) -> dict:
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import torch

    reason = no_cuda(torch)
    if reason is not None:
        return {"cuda": False, "reason": reason, "gpus": [], "torch": torch.__version__}
    deterministic(torch)
    before = kernel_xids()
    fields, smi_error = first_fields()
    began = time.monotonic()
    sampler = Sampler(fields, max(interval, seconds / MAX_SAMPLES), began) if fields else None
    if sampler:
        sampler.start()
    out: dict = {}
    count = torch.cuda.device_count()
    threads = [threading.Thread(target=gpu_thread, args=(torch, i, n, seconds, out)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    smi = sampler.stop() if sampler else {"error": smi_error}
    after = kernel_xids()
    if "error" in before or "error" in after:
        xids = {"error": before.get("error") or after.get("error")}
    else:
        xids = {"source": after["source"], "before": before["lines"], "after": after["lines"]}
    return {
        "cuda": True,
        "torch": torch.__version__,
        "cuda_version": torch.version.cuda,
        "seconds": seconds,
        "matmul_n": n,
        "fixed": FIXED,
        "gpus": [out[i] for i in sorted(out)],
        "smi": smi,
        "xids": xids,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpuburn", description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, required=True, help="how long every GPU is under load")
    parser.add_argument("--matmul-n", type=int, default=8192, help="the multiplied matrices' side")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between nvidia-smi samples")
    args = parser.parse_args(argv)
    if args.seconds <= 0 or args.matmul_n < 1 or args.interval <= 0:
        parser.error("--seconds, --matmul-n and --interval must be positive")
    print(json.dumps(run(args.seconds, args.matmul_n, args.interval)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
