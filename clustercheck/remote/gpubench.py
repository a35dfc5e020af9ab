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

Each figure is the best of R timed repeats (CUDA events), after one untimed warm-up. The answer, one JSON object on
the last line: {"cuda": true, "torch", "cuda_version", "copy_counts", "gpus": [{index, bus_id, name, matmul_tflops:
{bf16, tf32, fp32}, memory_gbps, h2d_gbps, d2h_gbps, seconds} or {index, bus_id, name, error}]}; without a CUDA GPU
{"cuda": false, "reason": why, "gpus": []}: data, never an exception. torch's GPU index is the CUDA runtime's order
(CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER), which need not be nvidia-smi's: the bus id ties the two together.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import threading
import time

COPY_COUNTS = "read+written"  # how memory_gbps counts a copy's bytes (see the module's docstring)
DTYPES = ("bf16", "tf32", "fp32")


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

    def best(self, work, repeats: int) -> float:
        """The shortest of REPEATS timed calls of WORK, after one untimed one."""
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
        return max(min(times), 1e-9)

    def sync(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)


def matmul_tflops(torch, device, dtype: str, sizes: Sizes) -> float:
    """Dense N x N multiply throughput in DTYPE (bf16, tf32 or fp32; tf32/fp32 as torch.backends.cuda.matmul.
    allow_tf32 is set when it is called)."""
    n = sizes.matmul_n
    kind = torch.bfloat16 if dtype == "bf16" else torch.float32
    a = torch.randn(n, n, device=device, dtype=kind)
    b = torch.randn(n, n, device=device, dtype=kind)
    out = torch.empty(n, n, device=device, dtype=kind)
    seconds = Timer(torch, device).best(lambda: torch.mm(a, b, out=out), sizes.repeats)
    return 2 * n**3 / seconds / 1e12


def memory_gbps(torch, device, sizes: Sizes) -> float:
    """Device memory bandwidth from a copy of COPY_MIB MiB, every byte read and written counted (COPY_COUNTS)."""
    size = sizes.copy_mib * 2**20
    src = torch.empty(size, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    seconds = Timer(torch, device).best(lambda: dst.copy_(src), sizes.repeats)
    return 2 * size / seconds / 1e9


def host_gbps(torch, device, sizes: Sizes) -> tuple[float, float]:
    """(host-to-device, device-to-host) GB/s over pinned host memory of HOST_MIB MiB, each byte counted once."""
    size = sizes.host_mib * 2**20
    host = torch.empty(size, dtype=torch.uint8, pin_memory=device.type == "cuda").fill_(1)
    on_device = torch.empty(size, dtype=torch.uint8, device=device)
    timer = Timer(torch, device)
    h2d = timer.best(lambda: on_device.copy_(host, non_blocking=True), sizes.repeats)
    d2h = timer.best(lambda: host.copy_(on_device, non_blocking=True), sizes.repeats)
    return size / h2d / 1e9, size / d2h / 1e9


class Phases:
    """The phases every GPU's thread goes through together: a barrier before each, and the one global setting a
    phase needs (TF32 on or off) set once while every thread waits."""

    def __init__(self, torch, parties: int) -> None:
        self.torch = torch
        self.barrier = threading.Barrier(parties)
        self.turn = threading.Lock()  # the host copies: one GPU at a time

    def together(self, tf32: bool | None = None) -> None:
        index = self.barrier.wait()
        if index == 0 and tf32 is not None:
            self.torch.backends.cuda.matmul.allow_tf32 = tf32
        self.barrier.wait()


def steps(torch, device, sizes: Sizes, phases: Phases, figures: dict) -> list:
    """The measurements of one device, in order: (TF32 setting or None, the work, which stores its figure in
    FIGURES)."""
    figures["matmul_tflops"] = {}

    def matmul(dtype: str):
        def work() -> None:
            figures["matmul_tflops"][dtype] = rounded(matmul_tflops(torch, device, dtype, sizes))

        return work

    def memory() -> None:
        figures["memory_gbps"] = rounded(memory_gbps(torch, device, sizes))

    def host() -> None:
        with phases.turn:
            h2d, d2h = host_gbps(torch, device, sizes)
        figures["h2d_gbps"], figures["d2h_gbps"] = rounded(h2d), rounded(d2h)

    return [*((dtype == "tf32", matmul(dtype)) for dtype in DTYPES), (None, memory), (None, host)]


def rounded(value: float) -> float:
    """VALUE to 4 significant digits: a figure's precision is its timing's."""
    return float(f"{value:.4g}")


def measure(torch, device, sizes: Sizes, phases: Phases, entry: dict) -> None:
    """Every figure of one device (a CUDA GPU; the test suite's CPU proves the plumbing) into ENTRY, in step with
    the other devices' threads (PHASES). A failure (out of memory, a CUDA error) is ENTRY's "error"; the thread
    still joins every later phase, so the other devices go on."""
    began = time.perf_counter()
    for tf32, work in steps(torch, device, sizes, phases, entry):
        phases.together(tf32=tf32)
        if "error" in entry:
            continue
        try:
            work()
        except Exception as exc:  # the device's own failure is its answer
            entry["error"] = error_text(exc)
    entry["seconds"] = round(time.perf_counter() - began, 3)


def error_text(exc: BaseException) -> str:
    said = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {said[0]}" if said else type(exc).__name__


def gpu_thread(torch, index: int, sizes: Sizes, phases: Phases, out: dict) -> None:
    """GPU INDEX measured into OUT[INDEX]: its bus id and name, then its figures (measure)."""
    entry: dict = {"index": index, "bus_id": None, "name": None}
    out[index] = entry
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


def run(sizes: Sizes) -> dict:
    import torch

    reason = no_cuda(torch)
    if reason is not None:
        return {"cuda": False, "reason": reason, "gpus": [], "torch": torch.__version__}
    count = torch.cuda.device_count()
    phases = Phases(torch, count)
    out: dict = {}
    threads = [threading.Thread(target=gpu_thread, args=(torch, i, sizes, phases, out)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {
        "cuda": True,
        "torch": torch.__version__,
        "cuda_version": torch.version.cuda,
        "copy_counts": COPY_COUNTS,
        "sizes": vars(sizes),
        "gpus": [out[i] for i in sorted(out)],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpubench", description=__doc__.splitlines()[0])
    parser.add_argument("--matmul-n", type=int, default=Sizes().matmul_n, help="the multiplied matrices' side")
    parser.add_argument("--copy-mib", type=int, default=Sizes().copy_mib, help="MiB copied on each GPU")
    parser.add_argument("--host-mib", type=int, default=Sizes().host_mib, help="MiB copied to and from the host")
    parser.add_argument("--repeats", type=int, default=Sizes().repeats, help="timed repeats of each measurement")
    args = parser.parse_args(argv)
    if min(args.matmul_n, args.copy_mib, args.host_mib, args.repeats) < 1:
        parser.error("every size must be at least 1")
    answer = run(Sizes(args.matmul_n, args.copy_mib, args.host_mib, args.repeats))
    print(json.dumps(answer), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
