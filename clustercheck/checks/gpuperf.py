"""Each GPU measured at work (the core stage runs remote/gpubench.py on every GPU of a node at once), judged three
ways, pure: against the datasheet figures of the GPU's model (clustercheck/expected/, where the model's file gives
them), against the node's other GPUs of the same model, and (gpu.perf.cluster) against the cluster's GPUs
of the same model. A GPU well below is named by its index and bus id, with what to look at.

The figures: dense multiply throughput in TFLOP/s (bf16, tf32, fp32), device memory bandwidth in GB/s from a
device-to-device copy counting every byte read and written (nvbandwidth counts a copy's bytes once: half of this),
host-to-device and device-to-host GB/s over pinned memory, each byte once. Each figure is gpubench's best of its
repeats (what the GPU can do, which a datasheet floor and a peer comparison ask about; something else on the node
only lowers a repeat), the median of the same repeats kept beside it in the data (`<figure>_median`).

A MIG instance (CUDA shows one per process; torch names it "NVIDIA H100 80GB HBM3 MIG 1g.10gb") is judged as what
it is: its multiply against its profile's share of the GPU's SMs, its memory copy against its share of the memory,
its host copies against the node's other instances only (mig_share); a profile the table cannot place is judged
against its peers only, and the message says so. The node's TF32 override variables, which change what "tf32" or
"fp32" measures underneath torch, are recorded in gpu.perf.matmul's data, and a WARN names them where set.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from statistics import median
from typing import Any

from clustercheck import expected as expected_values
from clustercheck.checks.registry import Finding, cluster_check, fail, node_check, passed, skip, unanswered, warn
from clustercheck.facts.model import GpuBench, GpuFigures, NodeFacts
from clustercheck.model import Measure, Metric
from clustercheck.selection import Selection

PEER_SHARE = 0.8  # a GPU under this share of its peers' median (the node's, the cluster's) is named


# The figures as metrics (report/prometheus.py), in Prometheus' base units: FLOP/s and bytes per second. Labels:
# host, gpu (torch's index), bus_id (nvidia-smi's), and the multiply's dtype or the copy's direction.
MATMUL_METRIC = Metric(
    "gpu_matmul_flops", "flops", "Dense matrix multiply throughput of one GPU (FLOP per second) by dtype."
)
MEMORY_METRIC = Metric(
    "gpu_memory_copy_bytes_per_second",
    "bytes_per_second",
    "Device memory bandwidth of one GPU: a device-to-device copy, bytes read and written counted.",
)
HOST_METRIC = Metric(
    "gpu_host_copy_bytes_per_second",
    "bytes_per_second",
    "Copy bandwidth between pinned host memory and one GPU, by direction, each byte once.",
)


@dataclass(frozen=True)
class Figure:
    """A measured figure: its name in the report's data, in words, its unit, and the model's expected figure it is
    judged against with the share of it a GPU must reach (1: the expected figure is a floor); as a metric: which,
    the factor from its unit to the metric's, and its own label."""

    name: str
    words: str
    unit: str
    expected: str
    share: float
    metric: Metric
    scale: float
    labels: tuple[tuple[str, str], ...]

    def shown(self, value: float) -> str:
        return f"{value:.0f} {self.unit}" if value >= 100 else f"{value:.3g} {self.unit}"


MATMUL_SHARE = expected_values.MATMUL_SHARE
MATMUL = tuple(
    Figure(
        f"matmul_{d}_tflops",
        f"{d} multiply",
        "TFLOP/s",
        f"matmul_{d}_tflops",
        MATMUL_SHARE,
        MATMUL_METRIC,
        1e12,
        (("dtype", d),),
    )
    for d in ("bf16", "tf32", "fp32")
)
MEMORY_SHARE = expected_values.MEMORY_BANDWIDTH_SHARE
MEMORY = (Figure("memory_gbps", "memory copy", "GB/s", "memory_bandwidth_gbps", MEMORY_SHARE, MEMORY_METRIC, 1e9, ()),)
HOST = (
    Figure(
        "h2d_gbps",
        "host-to-device copy",
        "GB/s",
        "host_copy_gbps",
        1.0,
        HOST_METRIC,
        1e9,
        (("direction", "host_to_device"),),
    ),
    Figure(
        "d2h_gbps",
        "device-to-host copy",
        "GB/s",
        "host_copy_gbps",
        1.0,
        HOST_METRIC,
        1e9,
        (("direction", "device_to_host"),),
    ),
)

MATMUL_FIX = (
    "A slow multiply: look at the GPU's clocks and throttle reasons (nvidia-smi -q -d PERFORMANCE,CLOCK), its power "
    "cap (nvidia-smi -q -d POWER; gpu.power_clocks), its temperature and cooling (gpu.throttle), and a process "
    "sharing the GPU (gpu.processes)."
)
MEMORY_FIX = (
    "Slow device memory: look at the memory clock (nvidia-smi -q -d CLOCK), a process sharing the GPU "
    "(gpu.processes), thermal throttling (gpu.throttle), and the GPU's memory health (gpu.ecc, gpu.remapped_rows)."
)
HOST_FIX = (
    "A slow copy between host and GPU: look at the GPU's PCIe link width and generation (nvidia-smi -q -d PCIE, "
    "pcie.link: a link trained at x8 or an older generation halves it), the slot or riser, the IOMMU mode "
    "(pcie.iommu), and a process sharing the GPU (gpu.processes)."
)
NOT_MEASURED = "the GPUs were not measured here (clustercheck run's core stage measures them)"

CHECKS = {"gpu.perf.matmul": MATMUL, "gpu.perf.memory": MEMORY, "gpu.perf.host_copy": HOST}

# NVIDIA's MIG user guide, "Supported MIG Profiles" (https://docs.nvidia.com/datacenter/tesla/mig-user-guide/
# supported-mig-profiles.html): a profile Ng.Mgb holds N of the GPU's compute slices, its "Fraction of SMs" N/7 on the
# GPUs of 7 instances (A100's MIG 1g.5gb: 1/7; H100's and H200's the same; the guide's "Supported GPUs" table gives 7
# as the "Max Number of Instances" of A100, H100, H200, H20, B200 and GB200) and N/4 on A30 (MIG 1g.6gb: 1/4) and the
# RTX PRO 6000 Blackwell; and M GB of the GPU's memory, its "Fraction of Memory" (H100's 1g.10gb: 1/8 of 80 GB),
# whose memory controllers come with it. A compute instance Cc.Ng.Mgb runs on C of its N slices.
MIG = re.compile(r"\bMIG\s+(?:(\d+)c\.)?(\d+)g\.(\d+)gb\b")
MIG_SLICES = {"A30": 4, "RTX PRO 6000": 4, "RTX PRO 5000": 2}  # the guide's Max Number of Instances, else 7
MIG_GUIDE = "NVIDIA's MIG user guide"
# NVIDIA_TF32_OVERRIDE=0 keeps cuBLAS and cuDNN off TF32 whatever torch asks (NVIDIA's cuBLAS documentation), so
# gpubench's "tf32" figure is a float32 one; TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 has torch's cuBLAS calls use TF32
# where float32 was asked (torch's "CUDA Environment Variables" page: "forces TF32 enablement"), so its "fp32"
# figure is a TF32 one.
TF32_OVERRIDDEN = {("NVIDIA_TF32_OVERRIDE", "0"): "tf32", ("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", "1"): "fp32"}
TF32_FIX = (
    "Unset the variable in the environment clustercheck's torch runs in (the node's shell profile, the container "
    "image, the Slurm job's environment) to measure what the figure names, or read the figure as what it measured."
)


@dataclass(frozen=True)
class MigShare:
    """A MIG instance's share of its GPU: its profile, its fraction of the SMs, of the memory (None: unknown)."""

    profile: str
    slices: int
    of: int
    memory: float | None

    @property
    def words(self) -> str:
        return f"a MIG {self.profile} instance, {self.slices}/{self.of} of the SMs"


def mig_share(name: str | None, model: expected_values.Model | None) -> MigShare | None:
    """The MIG instance torch names NAME, as MIG_GUIDE gives its share (None: a whole GPU)."""
    found = MIG.search(name or "")
    if not found:
        return None
    compute, slices, gigabytes = found.groups()
    of = next((n for key, n in MIG_SLICES.items() if key in (name or "")), 7)
    memory_gb = model.get("memory_gb") if model else None
    memory = min(1.0, int(gigabytes) / memory_gb) if memory_gb else None
    return MigShare(found.group(0).split(None, 1)[1], int(compute or slices), of, memory)


def _expected(g: GpuFigures, f: Figure, model: expected_values.Model | None, skipped: set[str]) -> float | None:
    """The figure G is judged against for F: the model's, or a MIG instance's share of it (None: not judged
    against the datasheet; a figure the TF32 variables change, SKIPPED, is not)."""
    want = model.get(f.expected) if model else None
    if want is None or f.name in skipped:
        return None
    share = mig_share(g.name, model)
    if share is None:
        return want
    if f in MATMUL:
        return want * share.slices / share.of
    if f in MEMORY and share.memory is not None:
        return want * share.memory
    return None  # host copies: the floor is the whole GPU's, an instance has its share of the copy engines


def _overridden(bench: GpuBench, figures: tuple[Figure, ...]) -> tuple[set[str], list[str]]:
    """The figures of FIGURES the node's TF32 override variables change, and the message's words for each."""
    names, said = set(), []
    for (variable, value), dtype in TF32_OVERRIDDEN.items():
        if (bench.tf32_overrides.get(variable) or "").strip() == value and f"matmul_{dtype}_tflops" in (
            f.name for f in figures
        ):
            names.add(f"matmul_{dtype}_tflops")
            measured = "float32 without TF32" if dtype == "tf32" else "TF32"
            said.append(f"{variable}={value} on the node: the {dtype} multiply measured {measured}, not judged")
    return names, said


CLUSTER = "gpu.perf.cluster"


def wanted(selection: Selection) -> bool:
    """Whether the core stage measures the GPUs: one of the checks that judge the figures (gpu.perf.*) is
    selected."""
    return any(selection.check_selected(name) for name in (*CHECKS, CLUSTER))


def _rows(gpus: tuple[GpuFigures, ...], figures: tuple[Figure, ...]) -> list[dict[str, Any]]:
    """Each GPU's figures of FIGURES, as the report's data keeps them."""
    rows = []
    for g in gpus:
        row: dict[str, Any] = {"index": g.index, "bus_id": g.bus_id, "name": g.name}
        row.update({f.name: g.figure(f.name) for f in figures})
        row.update({f"{f.name}_median": g.medians[f.name] for f in figures if f.name in g.medians})
        if g.error:
            row["error"] = g.error
        rows.append(row)
    return rows


def units(figures: tuple[Figure, ...]) -> dict[str, str]:
    """Each figure's unit by its name in the report's data (the JSON report's `units` beside `gpus`)."""
    return {f.name: f.unit for f in figures}


def measures(host: str, gpus: tuple[GpuFigures, ...], figures: tuple[Figure, ...]) -> tuple[Measure, ...]:
    """Each GPU's FIGURES as metrics, in the metric's unit, labelled with HOST, the GPU's index and bus id."""
    out: list[Measure] = []
    for g in gpus:
        for f in figures:
            value = g.figure(f.name)
            if value is None:
                continue
            labels = {"host": host, "gpu": str(g.index), "bus_id": g.bus_id or "", **dict(f.labels)}
            out += f.metric.of(value * f.scale, **labels)
    return tuple(out)


def _peer_medians(gpus: list[GpuFigures], figure: Figure) -> dict[str | None, tuple[float, int]]:
    """GPU name -> (median of FIGURE over the GPUs of that name that measured it, how many), where two or more did."""
    by_name: dict[str | None, list[float]] = {}
    for g in gpus:
        value = g.figure(figure.name)
        if value is not None:
            by_name.setdefault(g.name, []).append(value)
    return {name: (median(values), len(values)) for name, values in by_name.items() if len(values) >= 2}


def judge_node(
    bench: GpuBench | None, match: expected_values.Match, figures: tuple[Figure, ...], host: str = ""
) -> Finding:
    """FIGURES of the node's GPUs (BENCH) against the model's expected values (MATCH) and the node's other GPUs of
    the same model (pure); the figures measured are the finding's measures, labelled with HOST."""
    found = _judge_node(bench, match, figures)
    if bench is None or not bench.gpus:
        return found
    return replace(found, measures=measures(host, bench.gpus, figures))


def _judge_node(bench: GpuBench | None, match: expected_values.Match, figures: tuple[Figure, ...]) -> Finding:
    none = unanswered(bench, NOT_MEASURED, "gpubench", "could not be measured")
    if none:
        return none
    model = match.model
    gpus = list(bench.gpus)
    skipped, overridden = _overridden(bench, figures)
    medians = {f.name: _peer_medians(gpus, f) for f in figures}
    data: dict[str, Any] = {
        "gpus": _rows(bench.gpus, figures),
        "units": units(figures),
        "expected": {f.expected: model.get(f.expected) if model else None for f in figures},
        "node_median": {f.name: {str(k): round(m, 2) for k, (m, _) in medians[f.name].items()} for f in figures},
        "judged": "the best of gpubench's repeats (the median beside it: <figure>_median)",
    }
    if figures == MEMORY:
        data["copy_counts"] = bench.copy_counts
    if figures == MATMUL:
        data["tf32_overrides"] = bench.tf32_overrides
    mig = {g.label: vars(share) for g in gpus if (share := mig_share(g.name, model))}
    if mig:
        data["mig"] = mig
    errors, slow = [], []
    for g in gpus:
        if g.error:
            errors.append(f"{g.label}: not measured: {g.error}")
        for f in figures:
            value = g.figure(f.name)
            if value is None:
                continue
            slow += _below(g, f, value, _expected(g, f, model, skipped), model, medians[f.name].get(g.name))
    how = _judged_how(match, figures) + _mig_how(mig, figures)
    if errors and not all("out of memory" in e.lower() for e in errors):
        return fail("; ".join(errors + slow + overridden) + f" ({how})", **data)
    if overridden:
        return warn("; ".join(errors + slow + overridden) + f" ({how})", TF32_FIX, **data)
    if errors or slow:
        return warn("; ".join(errors + slow) + f" ({how})", **data)
    return passed(f"{len(gpus)} GPU(s): {_summary(gpus, figures)} ({how})", **data)


def _below(
    g: GpuFigures,
    f: Figure,
    value: float,
    want: float | None,
    model: expected_values.Model | None,
    peers: tuple[float, int] | None,
) -> list[str]:
    """What is slow about G's figure F (VALUE): under its share of WANT (the model's, or a MIG instance's share of
    it), under PEER_SHARE of its peers' median (PEERS)."""
    slow = []
    if want is not None and value < f.share * want:
        share = f"under {f.share:.0%} of " if f.share < 1 else "under "
        mig = mig_share(g.name, model)
        whose = f"{f.shown(want)} ({mig.words} of {model.name})" if mig else f"{model.name}'s {f.shown(want)}"
        slow.append(f"{g.label}: {f.words} {f.shown(value)}, {share}{whose}")
    if peers and value < PEER_SHARE * peers[0]:
        slow.append(
            f"{g.label}: {f.words} {f.shown(value)}, {value / peers[0]:.0%} of the median "
            f"{f.shown(peers[0])} of this node's {peers[1]} {g.name or 'GPU'}s"
        )
    return slow


def _mig_how(mig: dict[str, dict], figures: tuple[Figure, ...]) -> str:
    """The message's words for MIG instances: how they were judged."""
    if not mig:
        return ""
    profiles = ", ".join(sorted({m["profile"] for m in mig.values()}))
    if figures == HOST:
        return (
            f"; MIG instance(s) {profiles}: judged against the node's other instances only, the host copy floor "
            f"being the whole GPU's ({MIG_GUIDE}: an instance has its share of the copy engines)"
        )
    return f"; MIG instance(s) {profiles} judged against their profile's share of the GPU ({MIG_GUIDE})"


def _judged_how(match: expected_values.Match, figures: tuple[Figure, ...]) -> str:
    """What FIGURES were judged against: the model's expected values, or which of them it does not give."""
    if match.model is None:
        return match.fallback("judged against the node's other GPUs only")
    missing = sorted({f.expected for f in figures if match.model.get(f.expected) is None})
    if not missing:
        return match.why
    return f"{match.why}, which give no {', '.join(missing)}: judged against the node's other GPUs only"


def _summary(gpus: list[GpuFigures], figures: tuple[Figure, ...]) -> str:
    """'bf16 multiply 702 to 715 TFLOP/s, ...': each figure's range over the GPUs."""
    parts = []
    for f in figures:
        values = [v for v in (g.figure(f.name) for g in gpus) if v is not None]
        if values:
            low, high = min(values), max(values)
            span = f.shown(low) if f.shown(low) == f.shown(high) else f"{f.shown(low).split()[0]} to {f.shown(high)}"
            parts.append(f"{f.words} {span}")
    return ", ".join(parts)


@node_check(
    "gpu.perf.matmul",
    proves="every GPU multiplies dense matrices (bf16, tf32, fp32; all the node's GPUs at once) at the TFLOP/s its "
    "model's datasheet allows (where the model's expected values give it) and as fast as the node's other GPUs of "
    "its model; a slow GPU is named by index and bus id",
    fix=MATMUL_FIX,
    needs_gpu=True,
)
def gpu_perf_matmul(facts: NodeFacts) -> Finding:
    return judge_node(facts.gpu_bench, facts.expected, MATMUL, facts.host)


@node_check(
    "gpu.perf.memory",
    proves="every GPU's memory copies at the GB/s its model's datasheet allows (where the model's expected values "
    "give it; a device-to-device copy, bytes read and written counted) and as fast as the node's other GPUs",
    fix=MEMORY_FIX,
    needs_gpu=True,
)
def gpu_perf_memory(facts: NodeFacts) -> Finding:
    return judge_node(facts.gpu_bench, facts.expected, MEMORY, facts.host)


@node_check(
    "gpu.perf.host_copy",
    proves="every GPU copies to and from pinned host memory (one GPU at a time, each byte counted once) at its "
    "model's floor (where the model's expected values give one) and as fast as the node's other GPUs",
    fix=HOST_FIX,
    needs_gpu=True,
)
def gpu_perf_host_copy(facts: NodeFacts) -> Finding:
    return judge_node(facts.gpu_bench, facts.expected, HOST, facts.host)


ALL = MATMUL + MEMORY + HOST


def judge_cluster(benches: dict[str, GpuBench | None], figures: tuple[Figure, ...] = ALL) -> Finding:
    """Every measured GPU of BENCHES (host -> the node's figures) against the cluster's GPUs of the same model
    (pure): a GPU under PEER_SHARE of their median is named with its node, index and bus id."""
    gpus = [(host, g) for host, bench in benches.items() if bench is not None for g in bench.gpus]
    if not benches:
        return skip("no NVIDIA GPU on any node")
    if not gpus:
        reasons = sorted({(b.problem or f"gpubench: {b.failure}" if b else NOT_MEASURED) for b in benches.values()})
        return skip(f"no GPU measured on any node ({'; '.join(reasons)})")
    slow, medians = [], {}
    for f in figures:
        by_name: dict[str | None, list[tuple[str, GpuFigures, float]]] = {}
        for host, g in gpus:
            value = g.figure(f.name)
            if value is not None:
                by_name.setdefault(g.name, []).append((host, g, value))
        for name, measured in by_name.items():
            if len({host for host, _, _ in measured}) < 2:
                continue  # one node's GPUs: the node's own check compares them
            middle = median(v for _, _, v in measured)
            medians.setdefault(f.name, {})[str(name)] = round(middle, 2)
            slow += [
                f"{host} {g.label}: {f.words} {f.shown(v)}, {v / middle:.0%} of the median {f.shown(middle)} of the "
                f"cluster's {len(measured)} {name or 'GPU'}s"
                for host, g, v in measured
                if v < PEER_SHARE * middle
            ]
    data = {
        "cluster_median": medians,
        "gpus": {host: _rows(b.gpus, figures) for host, b in benches.items() if b},
        "units": units(figures),
    }
    if not medians:
        return skip("no GPU model measured on two or more nodes, nothing to compare", **data)
    if slow:
        return warn("; ".join(slow), **data)
    nodes = len({host for host, _ in gpus})
    return passed(f"{len(gpus)} GPU(s) on {nodes} node(s) within {PEER_SHARE:.0%} of their model's median", **data)


@cluster_check(
    CLUSTER,
    proves="no GPU is much slower (multiply, device memory, host copies) than the cluster's GPUs of the same model, "
    f"under {PEER_SHARE:.0%} of their median: a whole node whose GPUs are all slow is named here",
    fix="Compare the named GPUs' clocks, power caps, temperatures and PCIe links with a fast node's "
    "(nvidia-smi -q -d PERFORMANCE,CLOCK,POWER,PCIE), and look for a process sharing them.",
)
def gpu_perf_cluster(nodes: list[NodeFacts], config) -> Finding:
    from clustercheck.checks.consistency import too_few  # here: importing it above would register it first

    benches = {n.host: n.gpu_bench for n in nodes if n.smi is not None}
    if nodes and not benches:
        return skip("no NVIDIA GPU on any node")
    nothing = too_few(nodes)
    if nothing:
        return skip(nothing)
    return judge_cluster(benches)


# ------------------------------------------------------------------------------ the figures in a report (--baseline)


def report_figures(checks: list[dict]) -> dict[str, float]:
    """Each GPU's figures in a report's checks (the JSON report's gpu.perf.* data, a SKIP measured nothing), keyed
    '<host> GPU <bus id> <figure in words>': the same GPU in two reports by its bus id, whatever torch's index."""
    out: dict[str, float] = {}
    for check in checks:
        figures, host = CHECKS.get(check.get("name") or ""), check.get("host")
        if figures is None or host is None or check.get("status") == "SKIP":
            continue
        for row in (check.get("data") or {}).get("gpus") or []:
            if not isinstance(row, dict) or not row.get("bus_id"):
                continue
            for f in figures:
                value = row.get(f.name)
                if isinstance(value, int | float) and not isinstance(value, bool):
                    out[f"{host} GPU {row['bus_id']} {f.words}"] = float(value)
    return out


def shown_in(key: str, value: float) -> str:
    """VALUE of the figure a report_figures KEY names, with its unit: '512 TFLOP/s'."""
    return next(f for f in ALL if key.endswith(f" {f.words}")).shown(value)
