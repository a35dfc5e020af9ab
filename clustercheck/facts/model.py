"""The typed facts of one node, as every check reads them, and the declaration of each fact.

A field is None when it could not be collected; `missing[field]` then says why. Checks read fields, never the
collector's raw JSON (kept in `raw` for the run directory only).

Every NodeFacts field is declared once, as its field, with where its value comes from:
- `fact(remote.memlock, Memlock.from_probe)`: a node-side probe that reports under a key of its own
  (clustercheck/remote/facts.py, where `@fact("memlock")` gives the key) and the parser of its value;
- `collected("commands.ip_addr", read=readers.addresses)`: the collector's answer under those keys ("commands.X":
  a command's answer), read by a function of facts/readers.py;
- `given(...)`: what the collector's caller gives (the first command's python and clock, the run's size);
- `derived(...)`: computed from the other facts once they are collected;
- `learnt(...)`: what a stage learns after collection (DCGM, the GPUs measured): it returns new facts
  (dataclasses.replace), never changes these.
The collector (collect.build) fills every field from these declarations, and the facts are frozen after it; the
tests check every declaration against the node side and the recorded outputs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from clustercheck import expected as expected_values
from clustercheck.facts import readers
from clustercheck.facts.burn import GpuBurn
from clustercheck.facts.filesystems import Filesystems
from clustercheck.facts.managed import ManagedFiles
from clustercheck.facts.records import COULD_NOT_COLLECT as COULD_NOT_COLLECT
from clustercheck.facts.records import (  # noqa: F401 (the records NodeFacts' fields hold, imported from here)
    Address,
    DcgmDiag,
    Firewall,
    GpuBench,
    GpuFigures,
    GpuVisibility,
    Hostname,
    Image,
    LaunchSetting,
    Memlock,
    NeighThresholds,
    NetDev,
    OsInfo,
    Package,
    Packages,
    RdmaPort,
    Space,
    TimeSync,
    Torch,
    XidLog,
    count,
    mtus_by_iface,
    netdevs_by_name,
    path,
    rdma_ports_of,
    strings,
    text,
    truth,
)
from clustercheck.facts.smi import Gpu, GpuProcess, MigDevice, NvidiaSmi  # noqa: F401 (NodeFacts.smi's records)
from clustercheck.inventory import Node
from clustercheck.remote import facts as remote
from clustercheck.remote.probing import HUNG  # noqa: F401 (how a probe the collector gave up on begins its error)


@dataclass(frozen=True)
class Fact:
    """A fact the collector reports under a key of its own: the node-side function that gathers it and the
    parser of its value (which raises TypeError, ValueError, KeyError or AttributeError on a value it cannot
    read: "could not collect")."""

    probe: Callable[[], Any]
    parse: Callable[[Any], Any]

    @property
    def key(self) -> str:
        """The key the node side reports this fact under (its @fact declaration)."""
        keys = [key for key, function in remote.PROBES.items() if function is self.probe]
        if len(keys) != 1:
            raise LookupError(f"{self.probe.__name__} is not declared with @fact in clustercheck/remote/facts.py")
        return keys[0]


def fact(probe: Callable[[], Any], parse: Callable[[Any], Any]) -> Any:
    """A NodeFacts field filled from PROBE's value by PARSE; None (and why, in `missing`) when it failed."""
    return field(default=None, metadata={"fact": Fact(probe, parse)})


@dataclass(frozen=True)
class Collected:
    """A fact read from the collector's answer under KEYS ("commands.X": the answer of its command X) by READ, which
    is given their values (None where the answer has none) and returns the field's value, a readers.Noted (the
    value, and what of it could not be read), or raises readers.NotCollected (why)."""

    keys: tuple[str, ...]
    read: Callable[..., Any]


def collected(*keys: str, read: Callable[..., Any], default: Any = None, factory: Any = MISSING) -> Any:
    """A NodeFacts field the collector reads from its answer under KEYS with READ."""
    declaration = {"collected": Collected(keys, read)}
    if factory is not MISSING:
        return field(default_factory=factory, metadata=declaration)
    return field(default=default, metadata=declaration)


@dataclass(frozen=True)
class Source:
    """Where a field that the collector's answer does not hold comes from: KIND is given (by the collector's
    caller), derived (from the other facts, by COMPUTE, once they are collected), learnt (by a stage, after
    collection) or kept (the collector's own record); BY says who, in words."""

    kind: str
    by: str
    compute: Callable[[Any], Any] | None = None


def _source(kind: str, by: str, default: Any, factory: Any, compute: Callable[[Any], Any] | None = None) -> Any:
    metadata = {"source": Source(kind, by, compute)}
    if factory is not MISSING:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def given(by: str, default: Any = MISSING, factory: Any = MISSING) -> Any:
    """A NodeFacts field the collector's caller gives (collect.build's arguments)."""
    return _source("given", by, default, factory)


def derived(compute: Callable[[Any], Any], by: str, default: Any = None) -> Any:
    """A NodeFacts field COMPUTE(facts) fills once the collected ones are there."""
    return _source("derived", by, default, MISSING, compute)


def learnt(by: str) -> Any:
    """A NodeFacts field a stage fills after collection, with new facts (dataclasses.replace); None until then."""
    return _source("learnt", by, None, MISSING)


def kept(by: str) -> Any:
    """The collector's own record (why each missing fact is missing)."""
    return _source("kept", by, MISSING, dict)


@dataclass(frozen=True)
class NodeFacts:
    """What was learnt on one node, parsed once; frozen: a stage that learns more returns new facts."""

    node: Node = given("the inventory")
    python: str = given("the first command: the python the collector ran with")
    python_source: str = given("the first command: how it was chosen (inventory, /etc/clustercheck/python, ...)")
    python_missing: str | None = given("the first command: the configured python that does not exist", None)
    cluster_size: int = given("the run: how many nodes it checks", 1)
    clock_offset: float | None = given("the first command: node clock minus control clock, seconds", None)
    clock_uncertainty: float | None = given("the first command: half its round trip", None)
    filesystems: Filesystems | None = given("the first command: the file systems a job needs (filesystems.sh)", None)
    python_version: str | None = collected("python", read=readers.python_version)
    os: OsInfo | None = fact(remote.os_facts, OsInfo.from_probe)
    torch: Torch | None = collected("torch", read=readers.torch)
    imports: list[Package] = collected("torch", read=readers.imports, factory=list)  # torchvision, python_env_packages
    smi: NvidiaSmi | None = collected("commands.nvidia_smi_q", "gpu_processes", read=readers.smi)  # nvidia-smi -q
    smi_error: str | None = collected("commands.nvidia_smi_q", read=readers.smi_error)  # why nvidia-smi gave nothing
    # The whole kernel log: read by the node's own checks and evidence only, then dropped (None) by stages/core.settled
    kernel_log: str | None = collected("commands.kernel_log", "commands.dmesg", read=readers.kernel_log)
    neighbour_overflows: list[str] | None = collected(  # that log's neighbour-table overflow lines, kept to the end
        "commands.kernel_log", "commands.dmesg", read=readers.neighbour_overflows
    )
    xids: XidLog | None = collected("commands.xids", read=readers.xids)  # the driver's Xid lines since boot
    fabricmanager: str | None = collected("commands.fabricmanager", read=readers.fabricmanager)  # systemctl is-active
    nvswitches: int | None = fact(remote.nvswitches, count)
    time: TimeSync | None = collected("commands.timedatectl", "commands.chronyc", read=readers.time)
    firewall: Firewall | None = collected("commands.ufw", "commands.nft", "commands.iptables", read=readers.firewall)
    addresses: list[Address] | None = collected("commands.ip_addr", read=readers.addresses)
    default_route: str | None = collected("commands.ip_route", read=readers.default_route)  # `ip route get` output
    mtus: dict[str, int] | None = fact(remote.mtus, mtus_by_iface)
    shm: Space | None = fact(remote.shm, Space.from_probe)
    disks: list[Space] | None = collected("disk_root", read=readers.disks)
    memlock: Memlock | None = fact(remote.memlock, Memlock.from_probe)
    neigh: NeighThresholds | None = fact(remote.neigh_thresholds, NeighThresholds.from_probe)
    hostname: Hostname | None = fact(remote.hostname_facts, Hostname.from_probe)
    packages: Packages | None = fact(remote.packages, Packages.from_probe)
    launch_env: list[LaunchSetting] | None = collected("launch_files", read=readers.launch_env)
    gpu_visibility: GpuVisibility | None = fact(remote.gpu_visibility, GpuVisibility.from_probe)
    netdevs: dict[str, NetDev] | None = fact(remote.netdevs, netdevs_by_name)
    rdma_ports: list[RdmaPort] | None = fact(remote.infiniband, rdma_ports_of)  # [] where the node has no RDMA device
    modules: list[str] | None = fact(remote.kernel_modules, strings)  # loaded kernel modules
    cmdline: str | None = fact(remote.cmdline, text)  # /proc/cmdline
    nvlink: dict[str, dict[str, Any]] | None = collected("commands.nvlink", read=readers.nvlink)  # nvidia-smi nvlink -s
    nvlink_errors: dict[str, dict[str, Any]] | None = collected("commands.nvlink_errors", read=readers.nvlink_errors)
    gpu_bridges: dict[str, list[str]] | None = collected("gpu_bridges", read=readers.gpu_bridges)  # root complex first
    gpu_iommu: dict[str, str] = collected("gpu_bridges", read=readers.gpu_iommu, factory=dict)  # BDF -> IOMMU domain
    acs: dict[str, Any] = collected("gpu_bridges", read=readers.acs, factory=dict)  # bridge BDF -> its ACS control
    virt: str | None = collected("commands.virt", read=readers.virt)  # systemd-detect-virt --vm: none, kvm, ...
    dcgmi: str | None = fact(remote.dcgmi, path)  # where dcgmi is installed
    firewall_role_rules: bool | None = fact(remote.firewall_role_rules, truth)  # the firewall role's rules in ufw
    managed_files: ManagedFiles | None = fact(remote.managed_files, ManagedFiles.from_probe)  # the roles' files
    dcgm: DcgmDiag | None = learnt("the core stage, when --dcgm-level asks for it (stages/gpuwork.py)")
    gpu_bench: GpuBench | None = learnt("the core stage, when a gpu.* figure check is selected (stages/gpuwork.py)")
    gpu_burn: GpuBurn | None = learnt("the core stage, with run --burn (stages/gpuwork.py, facts/burn.py)")
    slurm_job: bool | None = learnt("node-health --slurm: whether a Slurm job runs on this node (None: not asked)")
    image: Image | None = learnt(
        "with --container, the image on this node (stages/image.py); python and torch are then the image's"
    )
    interface: str | None = derived(
        lambda facts: readers.cluster_interface(facts)[0], "the cluster interface, chosen once"
    )
    interface_how: str = derived(lambda facts: readers.cluster_interface(facts)[1], "how it was chosen", "not found")
    missing: dict[str, str] = kept("the collector: field -> why it could not be collected")
    raw: dict[str, Any] = given("the collector's answer, kept for the run directory", factory=dict)
    models: expected_values.Catalog = given(
        "the run: the expected values, shipped and the user's", factory=expected_values.shipped
    )

    @property
    def expected(self) -> expected_values.Match:
        """The model this node's GPUs are, with its expected values (clustercheck/expected/), or why none."""
        if self.smi is None:
            return expected_values.Match(None, "no GPU")
        return self.models.match(g.name for g in self.smi.gpus)

    @property
    def host(self) -> str:
        return self.node.name

    @property
    def gpus_present(self) -> int:
        return len(self.smi.gpus) if self.smi else 0

    @property
    def gpu_expected(self) -> bool:
        return bool(self.node.gpus_expected)

    @property
    def torch_python(self) -> str:
        """The python torch runs with: the environment's, or the image's with --container."""
        return (self.image.python or "python3") if self.image is not None else self.python

    @property
    def environment(self) -> str:
        """That python as the reports name it."""
        if self.image is not None:
            return f"{self.torch_python} in image {self.image.image}"
        return self.python

    @property
    def torch_problem(self) -> str | None:
        """Why torch cannot be used on this node (None when it can): the one place this is decided."""
        if self.image is not None and self.image.problem:
            return self.image.problem
        if self.python_missing:
            return f"the environment's python {self.python_missing} does not exist"
        if self.torch is None:
            return self.missing.get("torch", COULD_NOT_COLLECT)
        return None

    @property
    def gpus_for_torch(self) -> int:
        """GPUs a torch job can use on this node (0: CPU ranks over gloo)."""
        if self.torch is None or not self.torch.cuda_available:
            return 0
        return self.torch.device_count

    def why_missing(self, name: str) -> str:
        return self.missing.get(name, COULD_NOT_COLLECT)


def declared() -> dict[str, Fact]:
    """Every fact a probe reports under a key of its own, by the NodeFacts field it fills."""
    return {f.name: f.metadata["fact"] for f in fields(NodeFacts) if "fact" in f.metadata}


def declarations() -> dict[str, Fact | Collected | Source]:
    """Every NodeFacts field's declaration (where its value comes from), by name."""
    return {
        f.name: next(f.metadata[kind] for kind in ("fact", "collected", "source") if kind in f.metadata)
        for f in fields(NodeFacts)
    }
