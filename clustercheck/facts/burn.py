"""The node's GPUs under load (the core stage runs remote/gpuburn.py with `run --burn`), parsed (pure): each GPU's
load and fixed-computation hashes, the nvidia-smi samples taken meanwhile, and the Xid lines the kernel logged.

nvidia-smi's `--query-gpu=... --format=csv,noheader,nounits` prints one line per GPU, the fields in the order asked,
separated by ", "; a field the GPU does not support is "[N/A]" (or "[Not Supported]", "N/A"); the clocks-event
reasons are a hexadecimal bitmask ("0x0000000000000001"). Drivers before r535 call the reasons
clocks_throttle_reasons.*; their bits are NVML's nvmlClocksThrottleReasons, renamed nvmlClocksEventReasons with the
same values (REASONS).

A sample where nvidia-smi could not read one GPU keeps the others' lines: the line it printed for that GPU instead
("Unable to determine the device handle for GPU1: 0000:34:00.0: Unknown Error", nvidia-smi 610 with one GPU fallen
off: tests/unit/data/README.md) is kept as a problem of that sample, with the bus id it names (SampleProblem).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

# NVML's clocks-event (formerly clocks-throttle) reason bits, from nvml.h as NVIDIA's NVML API reference gives them
# (https://docs.nvidia.com/deploy/nvml-api/group__nvmlClocksEventReasons.html, and group__nvmlClocksThrottleReasons
# for the older names; the same values in NVIDIA's Python bindings, nvidia-ml-py's pynvml.py):
# nvmlClocksEventReasonGpuIdle 0x1, ApplicationsClocksSetting 0x2, SwPowerCap 0x4, HwSlowdown 0x8, SyncBoost 0x10,
# SwThermalSlowdown 0x20, HwThermalSlowdown 0x40, HwPowerBrakeSlowdown 0x80, DisplayClockSetting 0x100; and the newer
# nvmlClocksEventReasonBoardLimit ("Board limit.") 0x200 and nvmlClocksEventReasonReliability ("Reliability.") 0x400
# (NVML's current reference, https://docs.nvidia.com/deploy/nvml-api/api/group__nvmlClocksEventReasons.html; the
# values as NVIDIA's cuda-python bindings give them: cuda.bindings.nvml.ClocksEventReasons EVENT_REASON_BOARD_LIMIT
# 512, EVENT_REASON_RELIABILITY 1024).
REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clocks_setting",
    0x200: "board_limit",
    0x400: "reliability",
}
NOT_A_VALUE = {"", "N/A", "[N/A]", "[Not Supported]", "Not Supported", "[Unknown Error]", "[Insufficient Permissions]"}
OLD_PREFIX, NEW_PREFIX = "clocks_throttle_reasons.", "clocks_event_reasons."


def reasons(mask: int | None) -> tuple[str, ...]:
    """The names of the reason bits set in MASK (NVML's, REASONS), lowest bit first; an unknown bit by its value."""
    if not mask:
        return ()
    return tuple(REASONS.get(1 << bit, hex(1 << bit)) for bit in range(mask.bit_length()) if mask >> bit & 1)


def value(text: str) -> Any:
    """One field of nvidia-smi's CSV: None where it gives none, an int for a bitmask (0x...) or a whole number, a
    float, else the text. A unit left on it ("1980 MHz", "631.95 W": without nounits) is dropped."""
    text = text.strip()
    if text in NOT_A_VALUE or (text.startswith("[") and text.endswith("]")):
        return None
    if text.lower().startswith("0x"):
        try:
            return int(text, 16)
        except ValueError:
            return text
    number = text.split(" ")[0]
    for kind in (int, float):
        try:
            return kind(number)
        except ValueError:
            continue
    return text


def parse_query(fields: list[str], lines: list[str]) -> list[dict[str, Any]]:
    """nvidia-smi --query-gpu=FIELDS --format=csv,noheader[,nounits] LINES -> one dict per GPU, keyed by the field
    names asked for, the older clocks_throttle_reasons.* under their new clocks_event_reasons.* names. A line with
    another number of fields than asked (a driver's message) is left out."""
    names = [f.replace(OLD_PREFIX, NEW_PREFIX) for f in fields]
    rows = []
    for line in lines:
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == len(names):
            rows.append({name: value(part) for name, part in zip(names, parts, strict=True)})
    return rows


@dataclass(frozen=True)
class Sample:
    """One GPU at one moment of the load (t: seconds into it), as nvidia-smi reported it."""

    t: float
    index: int | None
    bus_id: str | None
    sm_clock: float | None  # MHz
    max_sm_clock: float | None
    temperature: float | None  # C
    power: float | None  # W
    power_limit: float | None
    reasons: int | None  # the clocks-event reasons' bitmask
    ecc_corrected: int | None  # volatile totals (since the driver loaded)
    ecc_uncorrected: int | None
    memory_used: float | None = None  # MiB

    @classmethod
    def of(cls, t: float, row: dict[str, Any]) -> Sample:
        def number(key: str) -> Any:
            found = row.get(key)
            return found if isinstance(found, (int, float)) else None

        bus = row.get("pci.bus_id")
        return cls(
            t,
            number("index"),
            bus if isinstance(bus, str) else None,
            number("clocks.sm"),
            number("clocks.max.sm"),
            number("temperature.gpu"),
            number("power.draw"),
            number("power.limit"),
            number("clocks_event_reasons.active"),
            number("ecc.errors.corrected.volatile.total"),
            number("ecc.errors.uncorrected.volatile.total"),
            number("memory.used"),
        )


def samples_of(smi: dict[str, Any]) -> tuple[Sample, ...]:
    """The program's nvidia-smi samples ({"fields", "samples": [{"t", "lines"}]}), parsed."""
    fields = smi.get("fields") or []
    return tuple(Sample.of(s["t"], row) for s in smi.get("samples") or [] for row in parse_query(fields, s["lines"]))


BUS_ID = re.compile(r"\b([0-9A-Fa-f]{4,8}):([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})\.([0-7])\b")


def bus_id_in(text: str) -> str | None:
    """The PCI address TEXT names, as nvidia-smi's query writes it (00000000:34:00.0); None where it names none."""
    found = BUS_ID.search(text)
    if not found:
        return None
    domain, bus, device, function = found.groups()
    return f"{int(domain, 16):08X}:{bus.upper()}:{device.upper()}.{function}"


@dataclass(frozen=True)
class SampleProblem:
    """What one sample could not read: a line nvidia-smi printed instead of a GPU's fields (the GPU it names by its
    bus id, where it does), or its error when it exited non-zero."""

    t: float
    text: str
    bus_id: str | None = None


def problems_of(smi: dict[str, Any]) -> tuple[SampleProblem, ...]:
    """Each sample's lines that are not a GPU's fields, and the error of a sample that kept some GPUs' lines."""
    fields = smi.get("fields") or []
    out = []
    for s in smi.get("samples") or []:
        odd = [line for line in s["lines"] if len(line.split(",")) != len(fields)]
        out += [SampleProblem(s["t"], line, bus_id_in(line)) for line in odd]
        if s.get("error") and not odd:
            out.append(SampleProblem(s["t"], s["error"]))
    return tuple(out)


@dataclass(frozen=True)
class BurnedGpu:
    """One GPU's load, as torch numbers it (the CUDA runtime's order; the bus id ties it to nvidia-smi's)."""

    index: int
    bus_id: str | None
    name: str | None
    iterations: int | None = None
    tflops: float | None = None  # bf16 multiply, sustained over the load
    hash_before: str | None = None  # the fixed computation's result, before and after the load
    hash_after: str | None = None
    error: str | None = None
    phase: str | None = None  # what it was doing when it failed or hung
    hung: bool = False  # its thread had not finished by the program's deadline
    load_began: float | None = None  # seconds on the samples' clock: its first multiply completed
    load_ended: float | None = None
    load_hash: str | None = None  # SHA-256 of the load's first product (a fixed seed: alike on GPUs of one model)
    load_checks: int | None = None  # comparisons of the product with the first during the load
    load_mismatches: int | None = None

    @property
    def label(self) -> str:
        return f"GPU {self.index}" + (f" ({self.bus_id})" if self.bus_id else "")

    @property
    def mig(self) -> str | None:
        """The MIG profile torch names this device by ("1g.10gb" in "NVIDIA H100 80GB HBM3 MIG 1g.10gb"), None for
        a whole GPU: CUDA shows one MIG instance per process, so the burn loads that slice only."""
        found = re.search(r"\bMIG\s+(\S+)$", self.name or "")
        return found.group(1) if found else None


@dataclass(frozen=True)
class GpuBurn:
    """The node's GPUs under load (remote/gpuburn.py's answer), or why there is none."""

    seconds: float = 0.0
    gpus: tuple[BurnedGpu, ...] = ()
    samples: tuple[Sample, ...] = ()
    sample_problems: tuple[SampleProblem, ...] = ()  # what samples could not read (a GPU nvidia-smi lost)
    smi_problem: str | None = None  # nvidia-smi could not be sampled: why
    xid_source: str | None = None
    new_xids: tuple[str, ...] = ()  # Xid lines the kernel logged during the load
    xid_problem: str | None = None  # the kernel log could not be read: why
    fixed: str = ""  # what the fixed computation and its environment were (torch, CUDA, sizes): hashes compare within
    problem: str | None = None  # nothing was loaded (no CUDA GPU for torch, torch does not import)
    failure: str | None = None  # the program gave no answer: why

    @classmethod
    def from_answer(cls, answer: dict[str, Any]) -> GpuBurn:
        if not answer.get("cuda"):
            return cls(problem=answer.get("reason") or "no CUDA GPU")
        gpus = tuple(_gpu(g) for g in answer.get("gpus") or [])
        if not gpus:
            return cls(problem="torch found no GPU to load")
        smi = answer.get("smi") or {}
        xids = answer.get("xids") or {}
        before = set(xids.get("before") or [])
        fixed = answer.get("fixed") or {}
        return cls(
            seconds=float(answer.get("seconds") or 0),
            gpus=gpus,
            samples=samples_of(smi),
            sample_problems=problems_of(smi),
            smi_problem=smi.get("error") or _no_samples(smi),
            xid_source=xids.get("source"),
            new_xids=tuple(line for line in xids.get("after") or [] if line not in before),
            xid_problem=xids.get("error"),
            fixed=f"torch {answer.get('torch')}, CUDA {answer.get('cuda_version')}, "
            f"{fixed.get('steps')} x {fixed.get('n')}^2 float32 multiplies, seed {fixed.get('seed')}",
        )


def _gpu(g: dict[str, Any]) -> BurnedGpu:
    """One GPU's entry of the answer."""
    known = BurnedGpu.__dataclass_fields__
    given = {k: v for k, v in g.items() if k in known and k not in ("index", "bus_id", "name", "hung")}
    return BurnedGpu(int(g["index"]), g.get("bus_id"), g.get("name"), hung=bool(g.get("hung")), **given)


def _no_samples(smi: dict[str, Any]) -> str | None:
    """Why the load has no nvidia-smi sample (None when it has some)."""
    if smi.get("samples"):
        return None
    return "; ".join(smi.get("errors") or []) or "nvidia-smi gave no sample"
