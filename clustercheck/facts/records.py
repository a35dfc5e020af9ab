"""The records the node's facts are made of (each NodeFacts field's type, clustercheck/facts/model.py), with the
parsers of the probe values they are read from. Pure, no I/O."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from ipaddress import IPv4Interface, IPv6Interface
from typing import Any

COULD_NOT_COLLECT = "could not collect"


@dataclass(frozen=True)
class XidLog:
    """The NVIDIA driver's Xid lines since boot, as the collector found them on the node, with the lines that say
    from when an Xid counts (the driver's load, its line naming a GPU's UUID, a GPU reset's acknowledgement:
    facts/xidlog.py)."""

    source: str  # the program that answered: journalctl -k -b, or dmesg
    lines: list[str]  # only those lines (the first and last ones when there were very many)
    read: int  # how many lines of the kernel log were read


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
    imported_at: float | None = None  # when an import kept by node-health ran, if that one was reused


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

    @classmethod
    def from_probe(cls, value: dict[str, Any]) -> OsInfo:
        return cls(**{k: value.get(k) for k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class Space:
    path: str
    free_bytes: int
    total_bytes: int

    @classmethod
    def from_probe(cls, value: dict[str, Any]) -> Space:
        return cls(value["path"], value["free_bytes"], value["total_bytes"])


@dataclass(frozen=True)
class Memlock:
    soft: int | None  # None: unlimited
    hard: int | None

    @classmethod
    def from_probe(cls, value: dict[str, Any]) -> Memlock:
        return cls(value["soft"], value["hard"])


@dataclass(frozen=True)
class NeighThresholds:
    """net.ipv4.neigh.default.gc_thresh2 (above it the kernel evicts entries older than 5 s) and gc_thresh3 (the
    table's hard limit: a new neighbour past it is dropped, "neighbor table overflow!"); both None where the node's
    network namespace does not show them (a container, which shares its host's table)."""

    gc_thresh2: int | None
    gc_thresh3: int | None

    @classmethod
    def from_probe(cls, value: dict[str, Any]) -> NeighThresholds:
        if not value:
            return cls(None, None)
        return cls(int(value["gc_thresh2"]), int(value["gc_thresh3"]))


@dataclass(frozen=True)
class Hostname:
    name: str
    addresses: list[str]  # what the name resolves to on the node; empty when it does not resolve
    error: str | None = None

    @classmethod
    def from_probe(cls, value: dict[str, Any]) -> Hostname:
        return cls(value.get("hostname", "?"), list(value.get("addresses") or []), value.get("error"))


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
    active: bool  # incoming traffic is filtered: a packet no rule lets in is dropped (facts/firewall.py)
    tool: str | None  # what filters it: ufw, nftables or iptables
    rules: int
    filter: str | None = None  # what filters it, in words ("nftables chain input of table inet filter: ...")
    seen: str | None = None  # rules there are that filter nothing incoming ("nftables: 23 rule(s), Docker's, ...")
    port_rules: tuple[str, ...] = ()  # the rules that match a destination port, as listed (facts/firewall.py)


@dataclass(frozen=True)
class Packages:
    pip: dict[str, str]  # Python distribution name (lower case) -> version, as `pip freeze` lists them
    conda: dict[str, str] | None  # conda package -> "version=build" in a conda environment, else None
    prefix: str | None = None

    @classmethod
    def from_probe(cls, value: dict[str, Any]) -> Packages:
        pip = value.get("pip") if isinstance(value.get("pip"), dict) else {}
        conda = value.get("conda") if isinstance(value.get("conda"), dict) else None
        return cls(
            {_dist_name(k): str(v) for k, v in pip.items()},
            {str(k): str(v) for k, v in conda.items()} if conda is not None else None,
            value.get("prefix"),
        )


def _dist_name(name: str) -> str:
    """A distribution's canonical name (PEP 503), so nodes that spell it differently compare equal."""
    return re.sub(r"[-_.]+", "-", str(name)).lower()


@dataclass(frozen=True)
class LaunchSetting:
    """An NCCL_* or GLOO_* variable a user's job inherits from the node's configuration."""

    file: str
    line: int
    name: str
    value: str


VISIBILITY = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")
ENV_ASSIGNMENT = re.compile(r"^\s*(?:export\s+)?(?P<name>[A-Za-z_][A-Za-z0-9_]*)=(?P<value>\S*)")


@dataclass(frozen=True)
class GpuVisibility:
    """CUDA_VISIBLE_DEVICES and NVIDIA_VISIBLE_DEVICES on a node: their values where the collector and torch's import
    ran, and where the node's environment files or the login user's startup files set them."""

    environment: dict[str, str]
    settings: list[LaunchSetting]  # each assignment of one of them: file, line, name, value

    @classmethod
    def from_probe(cls, value: dict[str, Any]) -> GpuVisibility:
        settings = []
        for path, lines in (value.get("files") or {}).items():
            for number, line in lines:
                match = ENV_ASSIGNMENT.match(line)
                if match and match["name"] in VISIBILITY:
                    settings.append(LaunchSetting(path, int(number), match["name"], match["value"].strip("'\";")))
        return cls({str(k): str(v) for k, v in (value.get("environment") or {}).items()}, settings)

    def set_in(self, name: str) -> list[str]:
        """Where NAME is set on the node: 'FILE:LINE' each."""
        return [f"{s.file}:{s.line}" for s in self.settings if s.name == name]


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


def netdevs_by_name(value: dict[str, Any]) -> dict[str, NetDev]:
    """The collector's `netdevs` (each interface's sysfs type, bridge, virtual and operstate) by name."""
    return {
        name: NetDev(name, _int(d.get("type")), bool(d.get("bridge")), bool(d.get("virtual")), d.get("operstate"))
        for name, d in value.items()
        if isinstance(d, dict)
    }


def _int(text: Any) -> int | None:
    try:
        return int(str(text))
    except ValueError:
        return None


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


def rdma_ports_of(value: dict[str, Any]) -> list[RdmaPort]:
    """The collector's `infiniband` (/sys/class/infiniband/DEVICE/ports/PORT/{state,phys_state,rate,link_layer})
    as ports; [] where the node has no RDMA device."""
    return [
        RdmaPort(
            device,
            port,
            ib_field(p.get("state")),
            ib_field(p.get("phys_state")),
            p.get("rate"),
            ib_rate_gbps(p.get("rate")),
            p.get("link_layer"),
        )
        for device, ports in sorted(value.items())
        if isinstance(ports, dict)
        for port, p in sorted(ports.items())
    ]


def ib_field(text: str | None) -> str | None:
    """/sys/class/infiniband/*/ports/*/state is "4: ACTIVE", phys_state "5: LinkUp": the name part."""
    if text is None:
        return None
    return text.split(":", 1)[-1].strip() or None


def ib_rate_gbps(text: str | None) -> float | None:
    """'400 Gb/sec (4X NDR)' -> 400.0."""
    match = re.match(r"\s*([\d.]+)\s*Gb/sec", text or "")
    return float(match[1]) if match else None


def mtus_by_iface(value: dict[str, Any]) -> dict[str, int]:
    return {k: v for k, v in value.items() if isinstance(v, int)}


def strings(value: list[Any]) -> list[str]:
    if not isinstance(value, list):
        raise TypeError(f"a list was expected, not {type(value).__name__}")
    return [str(v) for v in value]


def text(value: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"a string was expected, not {type(value).__name__}")
    return value


def count(value: Any) -> int | None:
    return value if isinstance(value, int) else None


def truth(value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"true or false was expected, not {type(value).__name__}")
    return value


def path(value: Any) -> str | None:
    return value if isinstance(value, str) else None


@dataclass(frozen=True)
class DcgmDiag:
    """`dcgmi diag -r LEVEL` on the node (run only with --dcgm-level)."""

    level: int
    tests: list[dict[str, Any]]  # {section, test, result, info?}
    metadata: dict[str, str]
    error: str | None = None  # why it gave no verdict (timed out, dcgmi failed)


@dataclass(frozen=True)
class GpuFigures:
    """One GPU's figures from the node-side `gpubench` (None: not measured, `error` says why)."""

    index: int  # torch's index (the CUDA runtime's order, which need not be nvidia-smi's)
    bus_id: str | None  # as nvidia-smi writes it (00000000:18:00.0); None where torch does not give it
    name: str | None
    matmul_tflops: dict[str, float]  # bf16, tf32, fp32 -> dense multiply TFLOP/s
    memory_gbps: float | None  # device-to-device copy, GB/s, bytes read and written counted (GpuBench.copy_counts)
    h2d_gbps: float | None  # host to device over pinned memory, GB/s, each byte once
    d2h_gbps: float | None
    error: str | None = None  # why a figure is missing (out of memory, a CUDA error)
    medians: dict[str, float] = field(default_factory=dict)  # report name -> the median repeat's figure

    @property
    def label(self) -> str:
        """How a message names it: 'GPU 3 (00000000:5D:00.0)'."""
        return f"GPU {self.index}" + (f" ({self.bus_id})" if self.bus_id else "")

    def figure(self, name: str) -> float | None:
        """A figure by its report name (matmul_bf16_tflops, memory_gbps, h2d_gbps, d2h_gbps): the best repeat's."""
        if name.startswith("matmul_"):
            return self.matmul_tflops.get(name.split("_")[1])
        return getattr(self, name)

    @classmethod
    def from_answer(cls, entry: dict[str, Any]) -> GpuFigures:
        def number(value: Any) -> float | None:
            return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

        matmul = {k: float(v) for k, v in (entry.get("matmul_tflops") or {}).items() if number(v) is not None}
        medians = {f"matmul_{k}_tflops": v for k, v in (entry.get("matmul_tflops_median") or {}).items()}
        medians |= {n: entry[f"{n}_median"] for n in ("memory_gbps", "h2d_gbps", "d2h_gbps") if f"{n}_median" in entry}
        medians = {k: float(v) for k, v in medians.items() if number(v) is not None}
        return cls(
            int(entry["index"]),
            entry.get("bus_id"),
            entry.get("name"),
            matmul,
            number(entry.get("memory_gbps")),
            number(entry.get("h2d_gbps")),
            number(entry.get("d2h_gbps")),
            entry.get("error") or (f"did not finish ({entry.get('phase')}), hung" if entry.get("hung") else None),
            medians,
        )


@dataclass(frozen=True)
class GpuBench:
    """The node's GPUs measured (the core stage runs remote/gpubench.py): each GPU's figures, or why none were."""

    gpus: tuple[GpuFigures, ...] = ()
    problem: str | None = None  # why nothing was measured (torch sees no CUDA GPU, torch does not import)
    failure: str | None = None  # the program ran and gave no figures: why (its exit, its errors, its timeout)
    copy_counts: str | None = None  # how memory_gbps counts a copy's bytes ("read+written")
    tf32_overrides: dict[str, str | None] = field(default_factory=dict)  # the node's TF32 override variables

    @classmethod
    def from_answer(cls, answer: dict[str, Any]) -> GpuBench:
        """The program's JSON answer; one that measured nothing says why (its reason)."""
        if not answer.get("cuda"):
            return cls(problem=answer.get("reason") or "no CUDA GPU")
        gpus = tuple(GpuFigures.from_answer(g) for g in answer.get("gpus") or [])
        if not gpus:
            return cls(problem="torch found no GPU to measure")
        return cls(gpus, copy_counts=answer.get("copy_counts"), tf32_overrides=answer.get("tf32_overrides") or {})


@dataclass(frozen=True)
class Image:
    """With --container, the image on one node (clustercheck/container.py reads it): its ID (the digest of its
    configuration: the same image has the same ID on every node) and the repository digests it was pulled by, or
    why it could not be read."""

    image: str
    id: str | None = None
    digests: tuple[str, ...] = ()
    docker_problem: str | None = None  # Docker itself cannot be used by the node user (not installed, no access)
    image_problem: str | None = None  # Docker answers, the image is not there
    python: str | None = None  # the image's python, once the environment was read inside it
    refused: str | None = None  # Docker would not start the image (`docker run` exit 125): why

    @property
    def problem(self) -> str | None:
        """Why the image cannot be used on the node (None when it can)."""
        return self.docker_problem or self.image_problem
