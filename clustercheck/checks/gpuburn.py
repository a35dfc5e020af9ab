"""The node's GPUs under load (`clustercheck run --burn LENGTH`: the core stage runs remote/gpuburn.py), judged, pure:
a GPU that throttled for heat, a power brake or a hardware slowdown, whose SM clock under load fell well below its
peers', whose ECC counters moved, that logged an Xid, or whose fixed computation gave other bytes than its peers'
is named by index and bus id. Off by default (the load keeps the GPUs busy for its whole length): every gpu.burn.*
check SKIPs without --burn.
"""

from __future__ import annotations

from collections import Counter
from statistics import median
from typing import Any

from clustercheck.checks import xid_catalog
from clustercheck.checks.registry import Finding, fail, node_check, passed, skip, unanswered, warn
from clustercheck.checks.xid import judge_xids
from clustercheck.facts import parse
from clustercheck.facts.burn import GpuBurn, Sample, reasons
from clustercheck.facts.model import NodeFacts
from clustercheck.selection import Selection

NOT_ASKED = "the burn was not asked for (clustercheck run --burn 10m loads every GPU for 10 minutes)"
CLOCK_SHARE = 0.85  # a GPU whose median SM clock under load is under this share of its peers' median is named
WARM_UP = 10.0  # seconds (at most a fifth of the load) the clocks are left to settle before they are judged
# NVML's reason bits (facts/burn.py REASONS) that mean protection slowed the GPU down: a FAIL for the hardware's
# (the GPU halves its clocks or more: HwSlowdown, HwThermalSlowdown, HwPowerBrakeSlowdown), a WARN for the driver's
# thermal slowdown (SwThermalSlowdown). The power cap (SwPowerCap) is a GPU at its power limit, the normal state of a
# GPU under full load: kept in the data, not judged.
HARDWARE = 0x8 | 0x40 | 0x80
SOFTWARE_THERMAL = 0x20
NAMES = ("gpu.burn.load", "gpu.burn.throttle", "gpu.burn.clocks", "gpu.burn.ecc", "gpu.burn.xid", "gpu.burn.sdc")


def wanted(selection: Selection) -> bool:
    """Whether a gpu.burn.* check is selected (the burn runs only when one is, and --burn asks for it)."""
    return any(selection.check_selected(name) for name in NAMES)


def _burn(facts: NodeFacts) -> GpuBurn | Finding:
    """The node's burn, or the finding every gpu.burn.* check gives without one."""
    burn = facts.gpu_burn
    return unanswered(burn, NOT_ASKED, "gpuburn", "could not be loaded") or burn


def _by_bus(samples: tuple[Sample, ...]) -> dict[str, list[Sample]]:
    """Each GPU's samples by its bus id (nvidia-smi's index where the bus id is missing), in time order."""
    out: dict[str, list[Sample]] = {}
    for s in samples:
        out.setdefault(s.bus_id or f"index {s.index}", []).append(s)
    return out


def _label(gpu: list[Sample]) -> str:
    """How a message names the GPU of these samples: nvidia-smi's index and its bus id."""
    first = gpu[0]
    return f"GPU {first.index}" + (f" ({first.bus_id})" if first.bus_id else "")


def _under_load(burn: GpuBurn, gpu: list[Sample]) -> list[Sample]:
    """GPU's samples once the load has settled (after WARM_UP seconds, at most a fifth of it) until its end."""
    settle = min(WARM_UP, burn.seconds / 5)
    return [s for s in gpu if settle <= s.t <= burn.seconds + 1]


def _sampled(burn: GpuBurn) -> Finding | None:
    """The finding of a check that needs nvidia-smi's samples when there are none."""
    if burn.samples:
        return None
    return warn(f"nvidia-smi could not be sampled during the load: {burn.smi_problem}", smi_problem=burn.smi_problem)


@node_check(
    "gpu.burn.load",
    proves="with run --burn: every GPU ran dense bf16 multiplies (all the node's GPUs at once) for the whole length "
    "asked, at a sustained TFLOP/s within 85% of the node's other GPUs of its model",
    fix="A GPU that failed under load: read its error, the kernel log (gpu.burn.xid) and nvidia-smi -q; a slow one: "
    "its clocks and throttle reasons (gpu.burn.clocks, gpu.burn.throttle), its power cap (gpu.power_clocks), a "
    "process sharing it (gpu.processes).",
    needs_gpu=True,
)
def gpu_burn_load(facts: NodeFacts) -> Finding:
    burn = _burn(facts)
    return burn if isinstance(burn, Finding) else judge_load(burn)


def judge_load(burn: GpuBurn) -> Finding:
    rows = [
        {"index": g.index, "bus_id": g.bus_id, "name": g.name, "tflops": g.tflops, "error": g.error} for g in burn.gpus
    ]
    data: dict[str, Any] = {"seconds": burn.seconds, "gpus": rows}
    errors = [f"{g.label}: {g.error}" for g in burn.gpus if g.error]
    by_name: dict[str | None, list[float]] = {}
    for g in burn.gpus:
        if g.tflops is not None:
            by_name.setdefault(g.name, []).append(g.tflops)
    slow = []
    for g in burn.gpus:
        peers = by_name.get(g.name, [])
        if g.tflops is not None and len(peers) >= 2 and g.tflops < CLOCK_SHARE * median(peers):
            slow.append(f"{g.label}: {g.tflops:.0f} TFLOP/s, {g.tflops / median(peers):.0%} of the node's median")
    if errors:
        return fail("failed under load: " + "; ".join(errors + slow), **data)
    if slow:
        return warn("slow under load: " + "; ".join(slow), **data)
    done = ", ".join(f"{g.tflops:g}" for g in burn.gpus if g.tflops is not None)
    return passed(f"{len(burn.gpus)} GPU(s) under load for {burn.seconds:g} s: bf16 multiply {done} TFLOP/s", **data)


@node_check(
    "gpu.burn.throttle",
    proves="with run --burn: no GPU's clocks were slowed under load by hardware protection (NVML's clocks-event "
    "reasons HW slowdown, HW thermal slowdown, HW power brake: FAIL) or the driver's thermal slowdown (WARN), "
    "sampled every second or so with nvidia-smi; the power cap is a loaded GPU's normal state and is not judged",
    fix="Thermal: check the GPU's cooling (fans, airflow, inlet temperature, a blocked heatsink: nvidia-smi -q -d "
    "TEMPERATURE); HW power brake: the server's power supplies and the external power-brake signal (the BMC's "
    "event log); HW slowdown without either: have the GPU and board serviced.",
    needs_gpu=True,
)
def gpu_burn_throttle(facts: NodeFacts) -> Finding:
    burn = _burn(facts)
    return burn if isinstance(burn, Finding) else judge_throttle(burn)


def judge_throttle(burn: GpuBurn) -> Finding:
    none = _sampled(burn)
    if none:
        return none
    hard, soft, data = [], [], {}
    for bus, gpu in _by_bus(burn.samples).items():
        seen = [s for s in gpu if s.reasons]
        mask = 0
        for s in seen:
            mask |= s.reasons or 0
        data[bus] = {"reasons": list(reasons(mask)), "max_temperature": max((s.temperature or 0) for s in gpu)}
        for bits, into in ((HARDWARE, hard), (SOFTWARE_THERMAL, soft)):
            hit = [s for s in seen if (s.reasons or 0) & bits]
            if hit:
                names = ", ".join(reasons(mask & bits))
                hottest = max((s.temperature or 0) for s in hit)
                into.append(f"{_label(gpu)}: {names} in {len(hit)} of {len(gpu)} samples (up to {hottest:g} C)")
    if hard:
        return fail("slowed by hardware protection under load: " + "; ".join(hard + soft), gpus=data)
    if soft:
        return warn("slowed by the driver's thermal protection under load: " + "; ".join(soft), gpus=data)
    hottest = max((s.temperature or 0) for s in burn.samples)
    return passed(f"no protective slowdown in {len(burn.samples)} sample(s), up to {hottest:g} C", gpus=data)


@node_check(
    "gpu.burn.clocks",
    proves=f"with run --burn: every GPU's median SM clock under load is at least {CLOCK_SHARE:.0%} of the median of "
    "the node's GPUs (nvidia-smi's clocks.sm, after the load settles; the samples do not name the model, so a node "
    "of mixed models may WARN)",
    fix="A GPU clocked below its peers under the same load: compare its throttle reasons, temperature and power "
    "draw with theirs (gpu.burn.throttle's data, nvidia-smi -q -d PERFORMANCE,CLOCK,POWER), its power cap and "
    "application clocks (gpu.power_clocks), and locked clocks (nvidia-smi -rgc resets them).",
    needs_gpu=True,
)
def gpu_burn_clocks(facts: NodeFacts) -> Finding:
    burn = _burn(facts)
    return burn if isinstance(burn, Finding) else judge_clocks(burn)


def judge_clocks(burn: GpuBurn) -> Finding:
    none = _sampled(burn)
    if none:
        return none
    clocks: dict[str, tuple[str, float, float | None]] = {}
    for gpu in _by_bus(burn.samples).values():
        values = [s.sm_clock for s in _under_load(burn, gpu) if s.sm_clock is not None]
        if values:
            clocks[_label(gpu)] = (_label(gpu), median(values), gpu[-1].max_sm_clock)
    if not clocks:
        return warn("no SM clock was sampled under load", smi_problem=burn.smi_problem)
    middle = median(c for _, c, _ in clocks.values())
    data = {"median_sm_clock_mhz": {k: c for k, (_, c, _) in clocks.items()}, "node_median_mhz": middle}
    low = [
        f"{label}: {clock:g} MHz under load, {clock / middle:.0%} of the node's median {middle:g} MHz"
        + (f" (its maximum {top:g} MHz)" if top else "")
        for label, clock, top in clocks.values()
        if len(clocks) >= 2 and clock < CLOCK_SHARE * middle
    ]
    if low:
        return warn("; ".join(low), **data)
    span = sorted(c for _, c, _ in clocks.values())
    return passed(f"{len(clocks)} GPU(s) at {span[0]:g} to {span[-1]:g} MHz under load", **data)


@node_check(
    "gpu.burn.ecc",
    proves="with run --burn: no GPU's volatile ECC error counters moved during the load (uncorrected: FAIL, "
    "corrected: WARN), read with nvidia-smi at its start and its end",
    fix="Uncorrected errors under load: drain the node and reset the GPU (nvidia-smi -r) or reboot, then run the "
    "burn again; if they return, have the GPU replaced. Corrected errors that grow under load: watch gpu.ecc and "
    "gpu.remapped_rows, and have the GPU inspected if they keep growing.",
    needs_gpu=True,
)
def gpu_burn_ecc(facts: NodeFacts) -> Finding:
    burn = _burn(facts)
    return burn if isinstance(burn, Finding) else judge_ecc(burn)


def judge_ecc(burn: GpuBurn) -> Finding:
    none = _sampled(burn)
    if none:
        return none
    moved: dict[str, dict[str, int]] = {}
    read = 0
    for gpu in _by_bus(burn.samples).values():
        for kind in ("corrected", "uncorrected"):
            counts = [getattr(s, f"ecc_{kind}") for s in gpu if getattr(s, f"ecc_{kind}") is not None]
            read += bool(counts)
            if counts and counts[-1] > counts[0]:
                moved.setdefault(_label(gpu), {})[kind] = counts[-1] - counts[0]
    if not read:
        return skip("no GPU reports ECC error counts (ECC off, or a model without ECC)")
    said = "; ".join(f"{k}: " + ", ".join(f"{n} {kind}" for kind, n in v.items()) for k, v in moved.items())
    if any("uncorrected" in v for v in moved.values()):
        return fail(f"ECC errors during the load: {said}", moved=moved)
    if moved:
        return warn(f"corrected ECC errors during the load: {said}", moved=moved)
    return passed("no ECC error counted during the load", moved={})


@node_check(
    "gpu.burn.xid",
    proves="with run --burn: the NVIDIA driver logged no Xid during the load (the kernel log read before and after "
    "it), each one judged by NVIDIA's Xid catalog as gpu.xid judges them",
    fix=f"Do what the message says for each Xid (NVIDIA's Xid catalog: {xid_catalog.CATALOG_URL}).",
    needs_gpu=True,
)
def gpu_burn_xid(facts: NodeFacts) -> Finding:
    burn = _burn(facts)
    return burn if isinstance(burn, Finding) else judge_xid(burn)


def judge_xid(burn: GpuBurn) -> Finding:
    if burn.xid_problem:
        return warn(
            f"the kernel log could not be read around the load: {burn.xid_problem}",
            "Run clustercheck as a user that can read the kernel log (root, or the adm/systemd-journal group); "
            "inside --container the image may not read the host's log.",
        )
    xids = parse.parse_xids("\n".join(burn.new_xids))
    if not xids:
        return passed(f"no Xid during the load ({burn.xid_source})", source=burn.xid_source)
    return judge_xids(xids, burn.xid_source or "the kernel log", when="during the load")


@node_check(
    "gpu.burn.sdc",
    proves="with run --burn: every GPU computes the same bytes as the node's other GPUs of its model (one fixed, "
    "seeded float32 computation with deterministic algorithms, before and after the load, compared by SHA-256), "
    "and the same after the load as before; a GPU that differs computes wrongly (silent data corruption): FAIL",
    fix="Take the GPU out of service now: drain the node, and have the GPU replaced (it returns wrong results "
    "without an error; run NVIDIA's field diagnostics or dcgmi diag -r 3 to confirm). Anything trained on it "
    "since it went bad is suspect.",
    needs_gpu=True,
)
def gpu_burn_sdc(facts: NodeFacts) -> Finding:
    burn = _burn(facts)
    return burn if isinstance(burn, Finding) else judge_sdc(burn)


def judge_sdc(burn: GpuBurn) -> Finding:
    data: dict[str, Any] = {"fixed": burn.fixed, "hashes": {}}
    wrong, compared = [], 0
    by_name: dict[str | None, list] = {}
    for g in burn.gpus:
        data["hashes"][g.label] = {"before": g.hash_before, "after": g.hash_after}
        if g.hash_before and g.hash_after:
            by_name.setdefault(g.name, []).append(g)
            if g.hash_before != g.hash_after:
                wrong.append(f"{g.label}: after the load its result differs from its own before it")
    for name, gpus in by_name.items():
        if len(gpus) < 2:
            continue
        compared += len(gpus)
        counts = Counter(g.hash_before for g in gpus)
        (common, most), *rest = counts.most_common()
        if rest and rest[0][1] == most:
            wrong.append(f"{', '.join(g.label for g in gpus)} ({name}): no majority among their results")
            continue
        wrong += [f"{g.label}: its result differs from its {most} peer(s)'" for g in gpus if g.hash_before != common]
    if wrong:
        return fail("wrong results (silent data corruption): " + "; ".join(wrong), **data)
    hashed = sum(len(g) for g in by_name.values())
    if not hashed:
        return warn("no GPU finished the fixed computation (see gpu.burn.load)", **data)
    peers = f", {compared} compared with their peers of the same model" if compared else ", none has a peer to compare"
    return passed(f"{hashed} GPU(s) gave the same result before and after the load{peers}", **data)
