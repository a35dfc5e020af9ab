"""The node's GPUs under load (`clustercheck run --burn LENGTH`: the core stage runs remote/gpuburn.py), judged, pure:
a GPU that throttled for heat, a power brake or a lasting hardware slowdown, whose SM clock under load fell well
below its peers', whose ECC counters moved, that logged an Xid, that hung, or whose results (the load's own product,
the fixed computation) differ from its peers' or change under load is named by index and bus id. Only the samples
taken while that GPU was under load are judged: from its own load's start (its first multiply done, on the samples'
clock) and WARM_UP seconds to settle, to its load's end. Off by default (the load keeps the GPUs busy for its whole
length): every gpu.burn.* check SKIPs without --burn.
"""

from __future__ import annotations

from collections import Counter
from statistics import median
from typing import Any

from clustercheck.checks import xid_catalog
from clustercheck.checks.registry import Finding, fail, node_check, passed, skip, unanswered, warn
from clustercheck.checks.xid import judge_xids
from clustercheck.facts import parse
from clustercheck.facts.burn import BurnedGpu, GpuBurn, Sample, reasons
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
# HW Slowdown (0x8) alone is judged only when it lasts: NVML documents that it "may be also reported during PState or
# clock change" (nvmlClocksThrottleReasonHwSlowdown in NVML's nvmlClocksEventReasons reference, the same note in
# DCGM's DCGM_CLOCKS_THROTTLE_REASON_HW_SLOWDOWN), which a GPU starting or ending a load goes through. The rule
# follows GPUd's hw-slowdown component (leptonai/gpud, components/accelerator/nvidia/hw-slowdown:
# DefaultStateHWSlowdownEventsThresholdFrequencyPerMinute = 0.6 over a 10-minute window, "to avoid false positives
# when the HW slowdown events are rare"): a FAIL when the bit is set in at least SLOWDOWN_SHARE of the GPU's samples
# under load, or without a break for SLOWDOWN_RUN seconds (GPUd's unit, a minute: a long burn's one lasting episode);
# fewer is a WARN that names it.
HW_SLOWDOWN = 0x8
SLOWDOWN_SHARE = 0.6
SLOWDOWN_RUN = 60.0
BUSY = ("out of memory", "busy or unavailable")  # a GPU another tenant holds: CUDA's words for it
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


def _loaded(burn: GpuBurn, bus: str | None) -> BurnedGpu | None:
    return next((g for g in burn.gpus if bus and g.bus_id == bus), None)


def _under_load(burn: GpuBurn, gpu: list[Sample]) -> list[Sample]:
    """GPU's samples once its load has settled (WARM_UP seconds, at most a fifth of the load, after its own first
    multiply completed) until its load ended. A GPU whose load never began has none; an answer without the load's
    times (an older node program) counts from the program's start."""
    settle = min(WARM_UP, burn.seconds / 5)
    loaded = _loaded(burn, gpu[0].bus_id)
    if loaded is not None and loaded.load_began is not None:
        end = loaded.load_ended if loaded.load_ended is not None else loaded.load_began + burn.seconds
        return [s for s in gpu if loaded.load_began + settle <= s.t <= end]
    if any(g.load_began is not None for g in burn.gpus):
        return []
    return [s for s in gpu if settle <= s.t <= burn.seconds + 1]


def _longest_run(samples: list[Sample], bit: int) -> float:
    """The longest time, in seconds between its first and last sample, BIT was set in SAMPLES without a break."""
    longest, first = 0.0, None
    for s in samples:
        if (s.reasons or 0) & bit:
            first = s.t if first is None else first
            longest = max(longest, s.t - first)
        else:
            first = None
    return longest


def _sampled(burn: GpuBurn) -> Finding | None:
    """The finding of a check that needs nvidia-smi's samples when there are none."""
    if burn.samples:
        return None
    return warn(f"nvidia-smi could not be sampled during the load: {burn.smi_problem}", smi_problem=burn.smi_problem)


@node_check(
    "gpu.burn.load",
    proves="with run --burn: every GPU ran dense bf16 multiplies (all the node's GPUs at once, each on its own clock) "
    "for the whole length asked, at a sustained TFLOP/s within 85% of the node's other GPUs of its model; a GPU that "
    "failed or hung is named with what it was doing (FAIL), one another tenant held at the start (out of memory, "
    "busy) with what holds it (WARN); a MIG instance's burn says it loaded that slice only",
    fix="A GPU that failed or hung under load: read its error, the kernel log (gpu.burn.xid) and nvidia-smi -q; one "
    "held at the start: stop or wait for the process named (gpu.processes), or find the container that holds its "
    "memory; a slow one: its clocks and throttle reasons (gpu.burn.clocks, gpu.burn.throttle), its power cap "
    "(gpu.power_clocks).",
    needs_gpu=True,
)
def gpu_burn_load(facts: NodeFacts) -> Finding:
    burn = _burn(facts)
    if isinstance(burn, Finding):
        return burn
    holders = {g.bus_id: [p.described for p in g.processes] for g in (facts.smi.gpus if facts.smi else [])}
    return judge_load(burn, holders)


def judge_load(burn: GpuBurn, holders: dict[str, list[str]] | None = None) -> Finding:
    """The load of every GPU: a GPU that failed or hung under load is a FAIL; one another tenant held at the start
    (out of memory, busy: what HOLDERS, bus id -> processes, and the samples' used memory say of it) a WARN, as a
    slow one is."""
    rows = [
        {"index": g.index, "bus_id": g.bus_id, "name": g.name, "tflops": g.tflops, "error": g.error}
        | ({"hung": True, "phase": g.phase} if g.hung else {})
        for g in burn.gpus
    ]
    data: dict[str, Any] = {"seconds": burn.seconds, "gpus": rows}
    hung = [f"{g.label}: did not finish ({g.phase or 'its phase unknown'}), hung" for g in burn.gpus if g.hung]
    held = [_held(burn, g, holders or {}) for g in burn.gpus if g.error and _busy_at_start(g)]
    errors = [
        f"{g.label}: {g.error}" + (f" ({g.phase})" if g.phase else "")
        for g in burn.gpus
        if g.error and not _busy_at_start(g)
    ]
    slow = _slow(burn)
    mig = _mig_note(burn)
    if hung or errors:
        return fail("failed under load: " + "; ".join(hung + errors + held + slow) + mig, **data)
    if held or slow:
        return warn("; ".join(held + slow) + mig, **data)
    done = ", ".join(f"{g.tflops:g}" for g in burn.gpus if g.tflops is not None)
    return passed(
        f"{len(burn.gpus)} GPU(s) under load for {burn.seconds:g} s: bf16 multiply {done} TFLOP/s{mig}", **data
    )


def _busy_at_start(g: BurnedGpu) -> bool:
    """Whether G could not start its load because the GPU was held: out of memory or busy before the load ran."""
    return g.load_began is None and any(word in (g.error or "").lower() for word in BUSY)


def _held(burn: GpuBurn, g: BurnedGpu, holders: dict[str, list[str]]) -> str:
    """'GPU 2 (bus): could not start: <error>; held by pid 4242 python (...)' or, with no process visible to
    nvidia-smi, the memory another container or PID namespace uses."""
    said = f"{g.label}: could not start the load, the GPU is held: {g.error}"
    procs = holders.get(g.bus_id or "")
    if procs:
        return f"{said}; held by {', '.join(procs)}"
    used = [s.memory_used for s in burn.samples if s.bus_id == g.bus_id and s.memory_used is not None]
    if used:
        return f"{said}; {max(used):g} MiB used with no process nvidia-smi can see (another container or PID namespace)"
    return f"{said}; no process nvidia-smi can see holds it"


def _slow(burn: GpuBurn) -> list[str]:
    by_name: dict[str | None, list[float]] = {}
    for g in burn.gpus:
        if g.tflops is not None:
            by_name.setdefault(g.name, []).append(g.tflops)
    slow = []
    for g in burn.gpus:
        peers = by_name.get(g.name, [])
        if g.tflops is not None and len(peers) >= 2 and g.tflops < CLOCK_SHARE * median(peers):
            slow.append(f"{g.label}: {g.tflops:.0f} TFLOP/s, {g.tflops / median(peers):.0%} of the node's median")
    return slow


def _mig_note(burn: GpuBurn) -> str:
    """The message's note where torch saw MIG instances: the burn loaded each instance, a slice of its GPU."""
    slices = sorted({g.mig for g in burn.gpus if g.mig})
    if not slices:
        return ""
    return (
        f" (MIG: torch sees MIG instance(s) {', '.join(slices)}, one per GPU; the burn loaded those slices only, not "
        "the whole GPUs: turn MIG off (nvidia-smi -mig 0) to burn them whole)"
    )


@node_check(
    "gpu.burn.throttle",
    proves="with run --burn: no GPU's clocks were slowed under its own load by hardware protection (NVML's "
    "clocks-event reasons HW thermal slowdown, HW power brake, and HW slowdown where it lasts: FAIL; a short HW "
    "slowdown, which NVML also reports during a clock change, or the driver's thermal slowdown: WARN), sampled every "
    "second or so with nvidia-smi; the power cap is a loaded GPU's normal state and is not judged; a GPU nvidia-smi "
    "could not read in a sample is named (WARN)",
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
    judged = 0
    for bus, gpu in _by_bus(burn.samples).items():
        loaded = _under_load(burn, gpu)
        judged += len(loaded)
        mask = 0
        for s in loaded:
            mask |= s.reasons or 0
        data[bus] = {
            "reasons": list(reasons(mask)),
            "samples_under_load": len(loaded),
            "max_temperature": max((s.temperature or 0) for s in gpu),
        }
        lasting = _slowdown_lasts(loaded)
        for bits, into in ((HARDWARE, hard), (SOFTWARE_THERMAL, soft)):
            hit = [s for s in loaded if (s.reasons or 0) & bits]
            if not hit:
                continue
            named = mask & bits
            if bits == HARDWARE and not lasting and not named & ~HW_SLOWDOWN:
                into = soft  # a short HW slowdown alone: NVML says a clock change shows it too
            hottest = max((s.temperature or 0) for s in hit)
            into.append(
                f"{_label(gpu)}: {', '.join(reasons(named))} in {len(hit)} of {len(loaded)} samples under load "
                f"(up to {hottest:g} C)" + ("" if lasting or not named & HW_SLOWDOWN else _SHORT)
            )
    unread = _unread(burn)
    if hard:
        return fail("slowed by hardware protection under load: " + "; ".join(hard + soft + unread), gpus=data)
    if soft or unread:
        return warn("slowed under load: " + "; ".join(soft + unread) if soft else "; ".join(unread), gpus=data)
    hottest = max((s.temperature or 0) for s in burn.samples)
    return passed(f"no protective slowdown in {judged} sample(s) under load, up to {hottest:g} C", gpus=data)


_SHORT = (
    f" (hw_slowdown in under {SLOWDOWN_SHARE:.0%} of them and never {SLOWDOWN_RUN:g} s on end: NVML reports it "
    "during a P-state or clock change too)"
)


def _slowdown_lasts(loaded: list[Sample]) -> bool:
    """Whether HW Slowdown (0x8) lasts in a GPU's samples under load (SLOWDOWN_SHARE of them, or SLOWDOWN_RUN
    seconds without a break)."""
    hit = sum(1 for s in loaded if (s.reasons or 0) & HW_SLOWDOWN)
    if not hit:
        return False
    return hit >= SLOWDOWN_SHARE * len(loaded) or _longest_run(loaded, HW_SLOWDOWN) >= SLOWDOWN_RUN


def _unread(burn: GpuBurn) -> list[str]:
    """The GPUs nvidia-smi could not read in some samples, each named with how often and what it printed; a
    sample's error that names no GPU, once."""
    by_gpu: dict[str, list] = {}
    for p in burn.sample_problems:
        by_gpu.setdefault(p.bus_id or "", []).append(p)
    total = len({s.t for s in burn.samples} | {p.t for p in burn.sample_problems})
    said = []
    for bus, problems in by_gpu.items():
        who = f"the GPU at {bus}" if bus else "a GPU"
        said.append(f"nvidia-smi could not read {who} in {len(problems)} of {total} samples: {problems[-1].text}")
    return said


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
    proves="with run --burn: every GPU computes the same bytes as the node's other GPUs of its model (the load's own "
    "bf16 product from a fixed seed, and one fixed float32 computation before and after the load, compared by "
    "SHA-256), its load's product stays the same during the load (compared with its first every 10 s or so), and its "
    "fixed result the same after the load as before; a GPU that differs computes wrongly (silent data corruption): "
    "FAIL",
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
    wrong: list[str] = []
    for g in burn.gpus:
        data["hashes"][g.label] = {
            "before": g.hash_before,
            "after": g.hash_after,
            "load": g.load_hash,
            "load_checks": g.load_checks,
            "load_mismatches": g.load_mismatches,
        }
        if g.hash_before and g.hash_after and g.hash_before != g.hash_after:
            wrong.append(f"{g.label}: after the load its fixed result differs from its own before it")
        if g.load_mismatches:
            wrong.append(
                f"{g.label}: its product changed during the load in {g.load_mismatches} of {g.load_checks} checks"
            )
    compared = 0
    for what, hashed in (("fixed result", lambda g: g.hash_before), ("load's product", lambda g: g.load_hash)):
        found, peers = _against_peers(burn.gpus, hashed, what)
        wrong += found
        compared = max(compared, peers)
    if wrong:
        return fail("wrong results (silent data corruption): " + "; ".join(wrong), **data)
    done = [g for g in burn.gpus if g.hash_before and g.hash_after]
    if not done:
        return warn("no GPU finished the fixed computation (see gpu.burn.load)", **data)
    checked = sum(g.load_checks or 0 for g in burn.gpus)
    during = f", the load's product alike in {checked} check(s) during it" if checked else ""
    peers = f", {compared} compared with their peers of the same model" if compared else ", none has a peer to compare"
    return passed(f"{len(done)} GPU(s) gave the same result before and after the load{during}{peers}", **data)


def _against_peers(gpus: tuple[BurnedGpu, ...], hashed, what: str) -> tuple[list[str], int]:
    """The GPUs whose HASHED result differs from the majority of the node's GPUs of their model (WHAT names the
    result), and how many GPUs were compared."""
    by_name: dict[str | None, list[BurnedGpu]] = {}
    for g in gpus:
        if hashed(g):
            by_name.setdefault(g.name, []).append(g)
    wrong, compared = [], 0
    for name, peers in by_name.items():
        if len(peers) < 2:
            continue
        compared += len(peers)
        (common, most), *rest = Counter(hashed(g) for g in peers).most_common()
        if rest and rest[0][1] == most:
            wrong.append(f"{', '.join(g.label for g in peers)} ({name}): no majority among their {what}s")
            continue
        wrong += [f"{g.label}: its {what} differs from its {most} peer(s)'" for g in peers if hashed(g) != common]
    return wrong, compared
