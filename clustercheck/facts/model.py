"""The typed facts of one node, as every check reads them.

A field is None when it could not be collected; `missing[field]` then says why. Checks read fields, never the
collector's raw JSON (kept in `raw` for the run directory only).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from ipaddress import IPv4Interface, IPv6Interface
from typing import Any

from clustercheck.facts.parse import NvidiaSmi
from clustercheck.inventory import Node

COULD_NOT_COLLECT = "could not collect"


@dataclass(frozen=True)
class Torch:
    version: str
    cuda: str | None  # the CUDA version torch was built for; None for a CPU build
    cuda_available: bool
    device_count: int
    nccl: str | None
    cudnn: int | None
    nccl_backend: bool  # torch.distributed's NCCL backend is built in
    gloo: bool
    nccl_error: str | None = None


@dataclass(frozen=True)
class Package:
    """A package the user's jobs import beside torch (python_env_packages, and torchvision when installed)."""

    name: str
    version: str | None  # None: not installed
    error: str | None  # why it does not import (or "not installed"); None when it imports
    requires_torch: tuple[str, ...] = ()  # its torch requirement, e.g. ("torch==2.13.0",)


@dataclass(frozen=True)
class OsInfo:
    pretty_name: str | None
    id: str | None
    version_id: str | None
    kernel: str | None
    arch: str | None
    cpu_model: str | None
    cpus: int | None
    mem_total_bytes: int | None


@dataclass(frozen=True)
class Space:
    path: str
    free_bytes: int
    total_bytes: int


@dataclass(frozen=True)
class Memlock:
    soft: int | None  # None: unlimited
    hard: int | None


@dataclass(frozen=True)
class Hostname:
    name: str
    addresses: list[str]  # what the name resolves to on the node; empty when it does not resolve
    error: str | None = None


@dataclass(frozen=True)
class Address:
    iface: str
    address: IPv4Interface | IPv6Interface


@dataclass(frozen=True)
class TimeSync:
    synchronized: bool | None  # None: neither timedatectl nor chronyc answered
    timedatectl: dict[str, str]
    chrony: dict[str, Any] | None
    chrony_error: str | None = None  # chronyc is installed but chronyd did not answer: its message


@dataclass(frozen=True)
class Firewall:
    collected: bool
    active: bool
    tool: str | None
    rules: int


@dataclass(frozen=True)
class Packages:
    pip: dict[str, str]  # Python distribution name (lower case) -> version, as `pip freeze` lists them
    conda: dict[str, str] | None  # conda package -> "version=build" in a conda environment, else None
    prefix: str | None = None


@dataclass(frozen=True)
class LaunchSetting:
    """An NCCL_* or GLOO_* variable a user's job inherits from the node's configuration."""

    file: str
    line: int
    name: str
    value: str


@dataclass(frozen=True)
class NetDev:
    name: str
    type: int | None  # ARP hardware type: 1 Ethernet, 32 InfiniBand, 772 loopback
    bridge: bool
    virtual: bool  # a software device (veth, bridge, docker0), not a NIC
    operstate: str | None

    @property
    def loopback(self) -> bool:
        return self.type == 772 or self.name == "lo"


@dataclass(frozen=True)
class RdmaPort:
    device: str  # mlx5_0
    port: str
    state: str | None  # ACTIVE, DOWN, INIT, ...
    phys_state: str | None  # LinkUp, Disabled, Polling, ...
    rate: str | None  # "400 Gb/sec (4X NDR)"
    rate_gbps: float | None
    link_layer: str | None  # InfiniBand or Ethernet (RoCE)

    @property
    def name(self) -> str:
        return f"{self.device}:{self.port}"

    @property
    def active(self) -> bool:
        return self.state == "ACTIVE" and self.phys_state == "LinkUp"


@dataclass(frozen=True)
class DcgmDiag:
    """`dcgmi diag -r LEVEL` on the node (run only with --dcgm-level)."""

    level: int
    tests: list[dict[str, Any]]  # {section, test, result, info?}
    metadata: dict[str, str]
    error: str | None = None  # why it gave no verdict (timed out, dcgmi failed)


@dataclass
class NodeFacts:
    """What was learnt on one node, parsed once."""

    node: Node
    python: str  # the python the collector ran with
    python_source: str  # how it was chosen: inventory, /etc/clustercheck/python, --python, python3, ...
    python_missing: str | None = None  # the configured python that does not exist, when we fell back
    cluster_size: int = 1
    clock_offset: float | None = None  # node clock minus control clock, seconds
    clock_uncertainty: float | None = None
    python_version: str | None = None
    os: OsInfo | None = None
    torch: Torch | None = None
    imports: list[Package] = field(default_factory=list)  # torchvision, python_env_packages: the torch probe
    smi: NvidiaSmi | None = None  # nvidia-smi -q; None when nvidia-smi is not there or failed
    smi_error: str | None = None  # why nvidia-smi gave nothing (not found, or its last line)
    kernel_log: str | None = None
    fabricmanager: str | None = None  # `systemctl is-active nvidia-fabricmanager`
    nvswitches: int | None = None
    time: TimeSync | None = None
    firewall: Firewall | None = None
    addresses: list[Address] | None = None
    default_route: str | None = None  # `ip route get` output
    mtus: dict[str, int] | None = None
    shm: Space | None = None
    disks: list[Space] | None = None
    memlock: Memlock | None = None
    hostname: Hostname | None = None
    packages: Packages | None = None
    launch_env: list[LaunchSetting] | None = None
    netdevs: dict[str, NetDev] | None = None
    rdma_ports: list[RdmaPort] | None = None  # [] where the node has no RDMA device
    modules: list[str] | None = None  # loaded kernel modules
    cmdline: str | None = None  # /proc/cmdline
    nvlink: dict[str, dict[str, Any]] | None = None  # nvidia-smi nvlink -s, parsed (parse.parse_nvlink_status)
    nvlink_errors: dict[str, dict[str, Any]] | None = None  # nvidia-smi nvlink -e (parse.parse_nvlink_errors)
    gpu_bridges: dict[str, list[str]] | None = None  # GPU BDF -> the bridges above it, root complex first
    gpu_iommu: dict[str, str] = field(default_factory=dict)  # GPU BDF -> IOMMU domain type (identity, DMA, ...)
    acs: dict[str, Any] = field(default_factory=dict)  # bridge BDF -> parse.parse_acs_control of its lspci -vvv
    virt: str | None = None  # systemd-detect-virt --vm: none, kvm, microsoft, ...
    dcgmi: str | None = None  # where dcgmi is installed
    dcgm: DcgmDiag | None = None  # set by the core stage when --dcgm-level asks for it
    interface: str | None = None  # the cluster interface, chosen once (see collect.cluster_interface)
    interface_how: str = "not found"
    missing: dict[str, str] = field(default_factory=dict)  # field -> why it could not be collected
    raw: dict[str, Any] = field(default_factory=dict)

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
    def torch_problem(self) -> str | None:
        """Why torch cannot be used on this node (None when it can): the one place this is decided."""
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
