"""Each GPU of the node measured, all of them at once (plain torch; Python 3.8+).

    gpubench [--matmul-n N] [--copy-mib M] [--host-mib H] [--repeats R]

One thread per CUDA GPU. Each measures, in phases the threads start together:
- dense matrix multiply throughput, TFLOP/s (2*N^3 floating-point operations per N x N multiply), in bf16, tf32
  (float32 inputs on the tensor cores) and fp32 (float32 without TF32), every GPU at once;
- device memory bandwidth, GB/s (10^9 bytes/s), from a device-to-device copy of M MiB, every GPU at once, counting
  every byte read and every byte written (2 x M MiB per copy; STREAM's and BabelStream's "copy" count, which sits
  next to the datasheet's memory bandwidth). nvbandwidth's device-local copy counts each byte once: half of this;
- host-to-device and device-to-host bandwidth, GB/s, over pinned host memory of H MiB, each byte counted once,
  one GPU at a time (each GPU's own PCIe link, not the host's share among them), the thread bound to the CPUs
  local to its GPU (/sys/bus/pci/devices/BDF/local_cpulist) so that the pinned buffer is on the GPU's NUMA node.

Each figure is the best of R timed repeats (CUDA events), after one untimed warm-up; the median of the same repeats
is given beside it (..._median). The best is the figure judged: it is what the GPU can do, which a datasheet floor
and a peer comparison ask about, and a repeat slowed by something else on the node (a kernel from another process,
a clock change) only lowers the median; torch.utils.benchmark's Timer reports a median over about a second, which
benchmarks/gpu_figures.py compares with ours. TF32 is switched with torch's fp32_precision API where torch has it
(the deprecated allow_tf32 before it), and the environment variables that override it underneath torch
(NVIDIA_TF32_OVERRIDE: cuBLAS and cuDNN; TORCH_ALLOW_TF32_CUBLAS_OVERRIDE: torch's cuBLAS calls) are recorded in
"tf32_overrides": with them, "tf32" or "fp32" may not measure what its name says.

Every GPU's thread waits for the others at each phase at most PHASE_WAIT seconds, and the program for all of them at
most --deadline seconds (gputhreads.run_each): a GPU that does not finish is named with its phase ("hung": true), the
others' figures are kept; once a phase's wait timed out, the GPUs go on without waiting for each other, the TF32
phases one GPU at a time (TF32 is one setting for the whole process).

The answer, one JSON object on the last line: {"cuda": true, "torch", "cuda_version", "copy_counts", "tf32_api",
"tf32_overrides", "gpus": [{index, bus_id, name, matmul_tflops: {bf16, tf32, fp32}, matmul_tflops_median: {...},
memory_gbps, memory_gbps_median, h2d_gbps, h2d_gbps_median, d2h_gbps, d2h_gbps_median, seconds} or {index, bus_id,
name, error, phase} or {..., hung: true, phase}], "together": whether every phase started on every GPU at once};
without a CUDA GPU {"cuda": false, "reason": why, "gpus": []}: data, never an exception. torch's GPU index is the
CUDA runtime's order (CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER), which need not be nvidia-smi's: the bus id ties the
two together.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import threading
import time

from .gputhreads import error_text, leave, run_each

COPY_COUNTS = "read+written"  # how memory_gbps counts a copy's bytes (see the module's docstring)
DTYPES = ("bf16", "tf32", "fp32")
# The variables that switch TF32 underneath torch's own setting: NVIDIA_TF32_OVERRIDE=0 turns TF32 off in cuBLAS and
# cuDNN whatever the program asks (NVIDIA's cuBLAS documentation, "NVIDIA_TF32_OVERRIDE"), so "tf32" measures plain
# float32; TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 makes torch's cuBLAS calls use TF32 even where float32 was asked for
# (torch's "CUDA Environment Variables" page: "forces TF32 enablement, overrides set_float32_matmul_precision"), so
# "fp32" measures TF32.
TF32_OVERRIDES = ("NVIDIA_TF32_OVERRIDE", "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE")
PHASE_WAIT = 30.0  # seconds a GPU waits at a phase's start for the others (a phase takes a second or two)
DEADLINE = 90.0  # seconds the program waits for every GPU: under the controller's 120 s (command_timeout)


class Sizes:
    """How much work each measurement does."""

    def __init__(self, matmul_n: int = 8192, copy_mib: int = 1024, host_mib: int = 256, repeats: int = 10) -> None:
        self.matmul_n = matmul_n
        self.copy_mib = copy_mib
        self.host_mib = host_mib
        self.repeats = repeats


def no_cuda(torch) -> str | None:
    """Why torch cannot measure a GPU here (None when it can)."""
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is built without CUDA: no GPU to measure"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no CUDA GPU: no GPU to measure"
    return None


def bus_id(torch, index: int) -> str | None:
    """GPU INDEX's PCI address as nvidia-smi writes it (00000000:18:00.0); None where torch does not give it."""
    props = torch.cuda.get_device_properties(index)
    try:
        return f"{props.pci_domain_id:08X}:{props.pci_bus_id:02X}:{props.pci_device_id:02X}.0"
    except AttributeError:
        return None


def local_cpus(bus: str | None) -> set[int] | None:
    """The CPUs local to the GPU at BUS (sysfs' local_cpulist), None where it cannot be read."""
    if not bus:
        return None
    domain, rest = bus.split(":", 1)
    path = f"/sys/bus/pci/devices/{int(domain, 16):04x}:{rest.lower()}/local_cpulist"
    try:
        with open(path) as fh:
            text = fh.read().strip()
    except OSError:
        return None
    cpus: set[int] = set()
    for part in text.split(","):
        low, _, high = part.partition("-")
        if low:
            cpus.update(range(int(low), int(high or low) + 1))
    return cpus or None


class Timer:
    """Seconds of work on DEVICE: CUDA events on a GPU, the wall clock elsewhere."""

    def __init__(self, torch, device) -> None:
        self.torch = torch
        self.device = device

    def best(self, work, repeats: int) -> tuple[float, float]:
        """(the shortest, the median) of REPEATS timed calls of WORK, after one untimed one."""
        torch = self.torch
        work()
        self.sync()
        times = []
        for _ in range(repeats):
            if self.device.type == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                work()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / 1000)
            else:
                began = time.perf_counter()
                work()
                times.append(time.perf_counter() - began)
        return max(min(times), 1e-9), max(statistics.median(times), 1e-9)

    def sync(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)


def set_tf32(torch, on: bool) -> str:
    """TF32 for float32 multiplies on or off, through torch's fp32_precision where this torch has it (the API that
    replaces the deprecated allow_tf32), else allow_tf32 (an older torch on the node); returns the API used."""
    matmul = torch.backends.cuda.matmul
    if hasattr(matmul, "fp32_precision"):
        matmul.fp32_precision = "tf32" if on else "ieee"
        return "torch.backends.cuda.matmul.fp32_precision"
    matmul.allow_tf32 = on
    return "torch.backends.cuda.matmul.allow_tf32"


def tf32_overrides() -> dict[str, str | None]:
    """The node's TF32_OVERRIDES variables as this process has them (None: unset)."""
    return {name: os.environ.get(name) for name in TF32_OVERRIDES}


def matmul_tflops(torch, device, dtype: str, sizes: Sizes) -> tuple[float, float]:
    """Dense N x N multiply throughput in DTYPE (bf16, tf32 or fp32; tf32/fp32 as TF32 is set when it is called):
    (from the best repeat, from the median one)."""
    n = sizes.matmul_n
    kind = torch.bfloat16 if dtype == "bf16" else torch.float32
    a = torch.randn(n, n, device=device, dtype=kind)
    b = torch.randn(n, n, device=device, dtype=kind)
    out = torch.empty(n, n, device=device, dtype=kind)
    best, middle = Timer(torch, device).best(lambda: torch.mm(a, b, out=out), sizes.repeats)
    return 2 * n**3 / best / 1e12, 2 * n**3 / middle / 1e12


def memory_gbps(torch, device, sizes: Sizes) -> tuple[float, float]:
    """Device memory bandwidth from a copy of COPY_MIB MiB, every byte read and written counted (COPY_COUNTS):
    (best, median)."""
    size = sizes.copy_mib * 2**20
    src = torch.empty(size, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    best, middle = Timer(torch, device).best(lambda: dst.copy_(src), sizes.repeats)
    return 2 * size / best / 1e9, 2 * size / middle / 1e9


def host_gbps(torch, device, sizes: Sizes) -> tuple[tuple[float, float], tuple[float, float]]:
    """((best, median) host-to-device, (best, median) device-to-host) GB/s over pinned host memory of HOST_MIB MiB,
    each byte counted once."""
    size = sizes.host_mib * 2**20
    host = torch.empty(size, dtype=torch.uint8, pin_memory=device.type == "cuda").fill_(1)
    on_device = torch.empty(size, dtype=torch.uint8, device=device)
    timer = Timer(torch, device)
    h2d = timer.best(lambda: on_device.copy_(host, non_blocking=True), sizes.repeats)
    d2h = timer.best(lambda: host.copy_(on_device, non_blocking=True), sizes.repeats)
    return (size / h2d[0] / 1e9, size / h2d[1] / 1e9), (size / d2h[0] / 1e9, size / d2h[1] / 1e9)


class Phases:
    """The phases every GPU's thread goes through together: a barrier before each (waited on at most WAIT
    seconds), and the one global setting a phase needs (TF32 on or off) set once while every thread waits. Once a
    wait timed out (a GPU hangs, or failed to start), the barrier is broken for good: the threads go on alone, and
    a phase that needs a TF32 setting runs one GPU at a time with its own (`alone`)."""

    def __init__(self, torch, parties: int, wait: float = PHASE_WAIT) -> None:
        self.torch = torch
        self.barrier = threading.Barrier(parties)
        self.wait = wait
        self.turn = threading.Lock()  # the host copies: one GPU at a time
        self.setting = threading.Lock()  # once apart: a TF32 phase holds it with its own setting
        self.api = ""

    @property
    def apart(self) -> bool:
        return self.barrier.broken

    def together(self, tf32: bool | None = None) -> None:
        try:
            index = self.barrier.wait(self.wait)
            if index == 0 and tf32 is not None:
                self.api = set_tf32(self.torch, tf32)
            self.barrier.wait(self.wait)
        except threading.BrokenBarrierError:
            return  # a GPU did not come: `alone` takes over

    @contextlib.contextmanager
    def alone(self, tf32: bool | None):
        """A phase's work once the GPUs are apart: with a TF32 setting, one GPU at a time under it."""
        if not self.apart or tf32 is None:
            yield
            return
        with self.holding(self.setting, "TF32 phase"):
            self.api = set_tf32(self.torch, tf32)
            yield

    @contextlib.contextmanager
    def holding(self, lock: threading.Lock, what: str):
        """LOCK held for one GPU's turn, waited for at most the phase's wait: a GPU that hangs holding it (in its
        host copy, its TF32 phase) fails the others' turn with a TimeoutError instead of hanging them too."""
        if not lock.acquire(timeout=self.wait):
            raise TimeoutError(f"another GPU's {what} did not end within {self.wait:g} s")
        try:
            yield
        finally:
            lock.release()


def steps(torch, device, sizes: Sizes, phases: Phases, figures: dict) -> list:
    """The measurements of one device, in order: (its phase's name, TF32 setting or None, the work, which stores
    its figures, the best and the median, in FIGURES)."""
    figures["matmul_tflops"], figures["matmul_tflops_median"] = {}, {}

    def matmul(dtype: str):
        def work() -> None:
            best, middle = matmul_tflops(torch, device, dtype, sizes)
            figures["matmul_tflops"][dtype], figures["matmul_tflops_median"][dtype] = rounded(best), rounded(middle)

        return work

    def memory() -> None:
        best, middle = memory_gbps(torch, device, sizes)
        figures["memory_gbps"], figures["memory_gbps_median"] = rounded(best), rounded(middle)

    def host() -> None:
        with phases.holding(phases.turn, "host copy"):
            h2d, d2h = host_gbps(torch, device, sizes)
        figures["h2d_gbps"], figures["h2d_gbps_median"] = rounded(h2d[0]), rounded(h2d[1])
        figures["d2h_gbps"], figures["d2h_gbps_median"] = rounded(d2h[0]), rounded(d2h[1])

    multiplies = [(f"{dtype} multiply", dtype == "tf32", matmul(dtype)) for dtype in DTYPES]
    return [*multiplies, ("memory copy", None, memory), ("host copies", None, host)]


def rounded(value: float) -> float:
    """VALUE to 4 significant digits: a figure's precision is its timing's."""
    return float(f"{value:.4g}")


def measure(torch, device, sizes: Sizes, phases: Phases, entry: dict, plan=steps) -> None:
    """Every figure of one device (a CUDA GPU; the test suite's CPU proves the plumbing) into ENTRY, in step with
    the other devices' threads (PHASES), ENTRY's "phase" naming the step under way (PLAN: the steps). A failure (out
    of memory, a CUDA error) is ENTRY's "error", its "phase" left where it failed; the thread still joins every
    later phase, so the other devices go on."""
    began = time.perf_counter()
    for name, tf32, work in plan(torch, device, sizes, phases, entry):
        phases.together(tf32=tf32)
        if "error" in entry:
            continue
        entry["phase"] = name
        try:
            with phases.alone(tf32):
                work()
        except Exception as exc:  # the device's own failure is its answer
            entry["error"] = error_text(exc)
    entry["seconds"] = round(time.perf_counter() - began, 3)


def gpu_thread(torch, sizes: Sizes, phases: Phases, index: int, entry: dict) -> None:
    """GPU INDEX measured into ENTRY: its bus id and name, then its figures (measure)."""
    try:
        entry["bus_id"] = bus_id(torch, index)
        entry["name"] = torch.cuda.get_device_name(index)
        cpus = local_cpus(entry["bus_id"])
        if cpus:
            with contextlib.suppress(AttributeError, OSError):
                os.sched_setaffinity(0, cpus)  # this thread only (Linux)
        torch.cuda.set_device(index)
    except Exception as exc:
        entry["error"] = error_text(exc)
    measure(torch, torch.device("cuda", index), sizes, phases, entry)


def run(sizes: Sizes, deadline: float = DEADLINE) -> tuple[dict, list[int]]:
    """The answer, and the GPUs whose thread had not finished by DEADLINE (hung)."""
    import torch

    reason = no_cuda(torch)
    if reason is not None:
        return {"cuda": False, "reason": reason, "gpus": [], "torch": torch.__version__}, []
    count = torch.cuda.device_count()
    phases = Phases(torch, count, min(PHASE_WAIT, deadline / 3))
    out, hung = run_each(count, lambda i, entry: gpu_thread(torch, sizes, phases, i, entry), deadline)
    answer = {
        "cuda": True,
        "torch": torch.__version__,
        "cuda_version": torch.version.cuda,
        "copy_counts": COPY_COUNTS,
        "tf32_api": phases.api or None,
        "tf32_overrides": tf32_overrides(),
        "together": not phases.apart,
        "sizes": vars(sizes),
        "gpus": [out[i] for i in sorted(out)],
    }
    return answer, hung


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpubench", description=__doc__.splitlines()[0])
    parser.add_argument("--matmul-n", type=int, default=Sizes().matmul_n, help="the multiplied matrices' side")
    parser.add_argument("--copy-mib", type=int, default=Sizes().copy_mib, help="MiB copied on each GPU")
    parser.add_argument("--host-mib", type=int, default=Sizes().host_mib, help="MiB copied to and from the host")
    parser.add_argument("--repeats", type=int, default=Sizes().repeats, help="timed repeats of each measurement")
    parser.add_argument("--deadline", type=float, default=DEADLINE, help="seconds to wait for every GPU")
    args = parser.parse_args(argv)
    if min(args.matmul_n, args.copy_mib, args.host_mib, args.repeats) < 1 or args.deadline <= 0:
        parser.error("every size must be at least 1")
    answer, hung = run(Sizes(args.matmul_n, args.copy_mib, args.host_mib, args.repeats), args.deadline)
    return leave(json.dumps(answer), hung)


if __name__ == "__main__":
    raise SystemExit(main())
