"""The transport the collectives job really used, per node: for NCCL, read from its NCCL_DEBUG=INFO output (the
network it chose: InfiniBand, RoCE, sockets or a net plugin such as AWS's Libfabric/EFA; the HCAs or interfaces;
GPUDirect RDMA; the paths inside the node; the rail map, which device each GPU's inter-node channels went through,
facts/nccl_log.py); for gloo, the local address of each rank's own TCP connections (its rail). Judged against
--expect-transport (or the inventory's clustercheck_expect_transport), against the other nodes (a node whose fabric
differs from the majority's: one node silently on sockets among InfiniBand nodes, pytorch/pytorch#111424), and
against the hardware the node has. Pure logic."""

from __future__ import annotations

import ipaddress
from collections import Counter
from dataclasses import dataclass
from typing import Any

from clustercheck.checks.registry import Finding, declare, fail, passed, skip, warn
from clustercheck.facts.model import NodeFacts
from clustercheck.facts.nccl_log import NcclTransport, parse_nccl_log, rail_map

__all__ = [
    "TRANSPORT",
    "Fabric",
    "NcclTransport",
    "gloo_fabric",
    "judge_gloo",
    "judge_nccl",
    "nccl_fabric",
    "parse_nccl_log",
]

TRANSPORT = declare(
    "transport.network",
    stage="collectives",
    scope="node",
    proves="the multi-node collectives ran over the transport expected (--expect-transport, or the node's "
    "hardware) and over the same fabric as the other nodes (network, GPUDirect RDMA, number of devices): NCCL's "
    "network (IB, RoCE, sockets, EFA), HCAs or interfaces, GPUDirect RDMA, intra-node paths and each GPU's rail "
    "(the device its inter-node channels went through) from its INFO log; for gloo, the interface each rank's "
    "connections bound to",
    fix="For NCCL on sockets where InfiniBand/RoCE exists: unset NCCL_IB_DISABLE and NCCL_NET=Socket, make "
    "NCCL_IB_HCA name this node's HCAs, check the HCA's driver and port (ibv_devinfo), install the RDMA libraries "
    "(rdma-core/libibverbs), give a container /dev/infiniband; load nvidia-peermem for GPUDirect RDMA; for a wrong "
    "interface, set NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME to the cluster interface (cluster_interface in the "
    "inventory).",
)


@dataclass(frozen=True)
class Fabric:
    """What a node's inter-node traffic ran over, as compared between nodes: the kind (IB, RoCE, Socket, EFA, ...),
    GPUDirect RDMA (None: not shown) and how many devices (HCAs or interfaces; 0: not known)."""

    kind: str
    gdr: bool | None
    devices: int

    def describe(self) -> str:
        text = self.kind
        if self.gdr is not None and self.kind != "Socket":
            text += " with GPUDirect RDMA" if self.gdr else " without GPUDirect RDMA"
        if self.devices:
            text += f", {self.devices} device{'s' if self.devices != 1 else ''}"
        return text


KINDS = {"ib": "IB", "roce": "RoCE", "ib+roce": "IB+RoCE", "socket": "Socket"}


def nccl_fabric(t: NcclTransport) -> Fabric | None:
    """A node's fabric from its NCCL log; None where the log shows no inter-node channel (nothing to compare). The
    devices counted are those NCCL listed for an RDMA network (a port that is down is not listed), not the
    interfaces of sockets, whose number differs between healthy nodes."""
    network = t.network
    if network is None or not t.channel_nets:
        return None
    listed = 0 if network == "socket" else max((len(d) for (_, n), d in t.devices.items() if n != "Socket"), default=0)
    return Fabric(KINDS.get(network, network.upper()), t.gdr, listed)


def gloo_fabric(bound: dict[str, Any]) -> Fabric | None:
    """A node's fabric under gloo: TCP sockets over the interfaces its ranks bound to."""
    return Fabric("Socket", False, len(bound["interfaces"])) if bound["interfaces"] else None


class Fabrics:
    """Every node's fabric (node -> Fabric, None where unknown), grouped once: each node's judgement reads the
    groups, so judging N nodes costs N, not N squared."""

    def __init__(self, fabrics: dict[str, Fabric | None]):
        self.of = {n: f for n, f in fabrics.items() if f is not None}
        self.groups: dict[Fabric, list[str]] = {}
        for node in sorted(self.of):
            self.groups.setdefault(self.of[node], []).append(node)
        self.ranked = sorted(self.groups.items(), key=lambda g: (-len(g[1]), g[0].describe()))


def against_majority(name: str | None, fabrics: Fabrics | dict[str, Fabric | None] | None) -> Finding | None:
    """FAIL where node NAME's fabric differs from the one most nodes use (or where the nodes split with no
    majority), naming what it uses and what the others use; None where it agrees or nothing is known."""
    if not name or not fabrics:
        return None
    known = fabrics if isinstance(fabrics, Fabrics) else Fabrics(fabrics)
    mine = known.of.get(name)
    if mine is None or len(known.groups) < 2:
        return None
    total = len(known.of)
    top, top_nodes = known.ranked[0]
    majority = len(top_nodes) * 2 > total
    if mine == top and majority:
        return None
    others = [(f, nodes) for f, nodes in known.ranked if f != mine]
    usage = "; ".join(
        f"{len(nodes)} of {total} nodes {'uses' if len(nodes) == 1 else 'use'} {f.describe()}" for f, nodes in others
    )
    count = sum(len(nodes) for _, nodes in others)
    peers = [n for _, nodes in others for n in nodes[:5]][:5]
    shown = ", ".join(peers) + (f" and {count - len(peers)} more" if count > len(peers) else "")
    split = "" if majority else " (no fabric has a majority: the nodes disagree)"
    message = f"its fabric differs from the others'{split}: it uses {mine.describe()}; {usage} ({shown})"
    theirs = others[0][0]  # the majority's, or where none has one the largest other group's
    return fail(message, fix=_majority_fix(mine, theirs), majority=theirs.describe())


def _majority_fix(mine: Fabric, top: Fabric) -> str:
    """The fix for a node on MINE where the others are on TOP: what differs first (network, GDR, devices)."""
    if mine.kind == "Socket" and top.kind != "Socket":
        return (
            f"NCCL on this node fell back to sockets where the others use {top.kind}: make NCCL_IB_HCA name this "
            "node's HCAs (or unset it), check the HCA's driver and port state (ibv_devinfo; rdma-core/libibverbs "
            "installed), unset NCCL_NET=Socket and NCCL_IB_DISABLE, and give a container /dev/infiniband."
        )
    if mine.kind != top.kind:
        return (
            f"This node's NCCL took {mine.kind} where the others take {top.kind}: set NCCL_NET and NCCL_IB_HCA "
            "alike on every node and check its adapters (ibv_devinfo)."
        )
    if mine.gdr is False and top.gdr:
        return (
            "GPUDirect RDMA is off on this node only: load nvidia-peermem (modprobe nvidia-peermem) and check "
            "NCCL_NET_GDR_LEVEL / NCCL_NET_GDR_READ alike on every node."
        )
    return (
        "This node's NCCL uses a different number of HCAs or interfaces than the others: one is down or missing "
        "(ibv_devinfo: port state and link layer; the HCA's driver), or NCCL_IB_HCA / NCCL_SOCKET_IFNAME differ "
        "between nodes."
    )


def rails_text(rails: dict[str, dict], unit: str) -> str:
    """'mlx5_0 (GPU 0, 1), mlx5_4 (GPU 4)': each device and the GPUs (or local ranks) whose traffic it carried."""
    by_device: dict[str, list[str]] = {}
    for key, rail in sorted(rails.items(), key=lambda kv: int(kv[0])):
        by_device.setdefault(rail["device"], []).append(key)
    return ", ".join(f"{device} ({unit} {', '.join(keys)})" for device, keys in by_device.items())


def describe(t: NcclTransport) -> str:
    network = t.network
    if network is None:
        return "NCCL's log names no network"
    if network in ("ib", "roce", "ib+roce"):
        hcas = ", ".join(sorted(t.hcas)) or "HCAs not named"
        gdr = {True: "GPUDirect RDMA used", False: "no GPUDirect RDMA", None: "GPUDirect RDMA not shown"}[t.gdr]
        what = f"NCCL over {network.upper().replace('ROCE', 'RoCE')} ({hcas}; {gdr})"
    elif network == "socket":
        what = f"NCCL over sockets ({', '.join(t.socket_ifaces) or 'interface not named'})"
    elif t.provider:
        nets = ", ".join(n for n in t.channel_nets) or ", ".join(dict.fromkeys(t.networks))
        gdr = {True: "GPUDirect RDMA used", False: "no GPUDirect RDMA", None: "GPUDirect RDMA not shown"}[t.gdr]
        what = f"NCCL over {t.provider.upper()} ({nets}; {gdr})"
    else:
        what = f"NCCL over {network}"
    if not t.channel_nets:
        what += ", no inter-node channel in the log"
    if t.intra:
        what += "; inside the node: " + ", ".join(f"{k}" for k, _ in t.intra.most_common())
    rails = rail_map(t)
    if rails:
        what += "; rails: " + rails_text(rails, "GPU")
    return what


def likely_cause(t: NcclTransport, facts: NodeFacts) -> str:
    """Why NCCL is on sockets although the node has an active RDMA port."""
    causes = []
    if t.ib_disabled or any(s.name == "NCCL_IB_DISABLE" and s.value.strip() == "1" for s in facts.launch_env or []):
        causes.append("NCCL_IB_DISABLE=1 is set")
    if t.no_ib_device:
        causes.append(
            "NCCL found no usable RDMA device (NET/IB : No device found): the RDMA libraries "
            "(libibverbs, rdma-core) are missing or the devices are not visible to the job"
        )
    if not causes:
        causes.append("NCCL_NET=Socket or an NCCL net plugin without IB support, or the RDMA libraries are missing")
    return "; ".join(causes)


def expected_for(facts: NodeFacts) -> str | None:
    """What the node's hardware suggests: ib or roce where it has an active RDMA port, else None."""
    layers = {p.link_layer for p in facts.rdma_ports or [] if p.active}
    if "InfiniBand" in layers:
        return "ib"
    if "Ethernet" in layers:
        return "roce"
    return None


def judge_nccl(
    t: NcclTransport,
    facts: NodeFacts,
    expect: str | None,
    fabrics: Fabrics | dict[str, Fabric | None] | None = None,
) -> Finding:
    """This node's NCCL transport against EXPECT, then against the other nodes' FABRICS (node -> nccl_fabric, this
    node's among them), then against its hardware."""
    fabric = nccl_fabric(t)
    data: dict[str, Any] = {
        "backend": "nccl",
        "network": t.network,
        "hcas": t.hcas,
        "socket_interfaces": t.socket_ifaces,
        "gpudirect_rdma": t.gdr,
        "gdr_disabled_hcas": t.gdr_disabled,
        "intra_node": dict(t.intra),
        "inter_node_channels": dict(t.channel_nets),
        "rails": rail_map(t),  # GPU index -> {device, port, kind, gdr, interface, channels}
        "rails_by": "gpu",
        "fabric": fabric.describe() if fabric else None,
        "expected": expect,
    }
    if not t.lines_seen:
        return skip("no NCCL INFO output from this node's ranks (see its nccl-*.log in the run directory)", **data)
    what = describe(t)
    network = t.network
    if expect:
        ok = network == expect or (expect == "ib" and network == "ib+roce")
        if not ok:
            cause = f": {likely_cause(t, facts)}" if network == "socket" else ""
            return fail(f"{what}, but {expect} was expected{cause}", **data)
    if odd := against_majority(facts.node.name, fabrics):
        return fail(f"{odd.message}; {what}", fix=odd.fix, **{**data, **odd.data})
    hardware = expected_for(facts)
    if network == "socket" and hardware:
        ports = ", ".join(p.name for p in facts.rdma_ports or [] if p.active)
        return warn(
            f"{what} although the node has active {hardware} port(s) ({ports}); likely cause: {likely_cause(t, facts)}",
            **data,
        )
    if network in ("ib", "roce", "ib+roce") and t.gdr is False and facts.gpus_present:
        peermem = any(m in (facts.modules or []) for m in ("nvidia_peermem", "nv_peer_mem"))
        cause = "nvidia-peermem is not loaded" if not peermem else "NCCL_NET_GDR_LEVEL or the PCIe topology"
        return warn(f"{what}: GPU memory goes through host memory ({cause})", **data)
    return passed(what, **data)


def gloo_interface(records: list[dict], facts: NodeFacts, master_port: int) -> dict[str, Any]:
    """The local addresses of this node's ranks' established connections (the store's excepted), the interfaces
    that hold them, and each local rank's rail: {"0": {"device": "eth1", "kind": "Socket", "interface", "address",
    ...}} keyed by the local rank (as text)."""
    by_address = {str(a.address.ip): a.iface for a in facts.addresses or []}
    addresses: Counter = Counter()
    interfaces: Counter = Counter()
    rails: dict[str, dict] = {}
    for record in records:
        mine: Counter = Counter()
        listening: Counter = Counter()
        for e in record.get("endpoints") or []:
            if master_port in (e.get("local_port"), e.get("remote_port")):
                continue
            if e.get("state") == "established":
                mine[e.get("local")] += 1
            elif e.get("state") == "listen" and not _wildcard(e.get("local")):
                listening[e.get("local")] += 1
        addresses.update(mine)
        for address, n in mine.items():
            interfaces[_interface(by_address, address)] += n
        if (mine or listening) and record.get("local_rank") is not None:
            rails[str(record["local_rank"])] = _gloo_rail(by_address, mine, listening)
    return {
        "addresses": sorted(a for a in addresses if a),
        "interfaces": [i for i, _ in interfaces.most_common()],
        "rails": rails,
    }


def _interface(by_address: dict[str, str], address: Any) -> str:
    return by_address.get(str(address)) or ("lo" if _loopback(address) else f"? ({address})")


def _wildcard(address: Any) -> bool:
    return str(address) in ("0.0.0.0", "::", "None")


def _gloo_rail(by_address: dict[str, str], connected: Counter, listening: Counter) -> dict[str, Any]:
    """One rank's rail: the interface of the address its gloo device listens on (GLOO_SOCKET_IFNAME's: the rank
    binds it), else of the local address most of its connections bound to. Its connections alone do not tell: a
    connection's local address is the one the route to the peer's listening address takes, so a rank on rail 1
    reaches the peers on rail 0 through rail 0 (seen on the test cluster's two rails)."""
    address = (listening or connected).most_common(1)[0][0]
    iface = _interface(by_address, address)
    rail = {"device": iface, "port": None, "kind": "Socket", "gdr": False, "interface": iface, "address": address}
    ifaces = sorted({_interface(by_address, a) for a in connected})
    if len(ifaces) > 1:
        rail["devices"] = ifaces  # the interfaces its connections went through
    return {**rail, "connections": sum(connected.values())}


def _loopback(address: Any) -> bool:
    try:
        return ipaddress.ip_address(str(address)).is_loopback
    except ValueError:
        return False


def judge_gloo(
    records: list[dict],
    facts: NodeFacts,
    cluster_interface: str | None,
    master_port: int,
    expect: str | None,
    fabrics: Fabrics | dict[str, Fabric | None] | None = None,
    rails: tuple[str, ...] = (),
) -> Finding:
    """This node's gloo ranks' connections against EXPECT, the other nodes' FABRICS (node -> gloo_fabric, this
    node's among them), and the interface each rank should bind: local rank i its rail, item i mod len of RAILS
    (the inventory's cluster_rail_interfaces), else the cluster interface."""
    bound = gloo_interface(records, facts, master_port)
    fabric = gloo_fabric(bound)
    data: dict[str, Any] = {
        "backend": "gloo",
        **bound,
        "rails_by": "local_rank",
        "fabric": fabric.describe() if fabric else None,
        "cluster_interface": cluster_interface,
        "expected": expect,
    }
    if not records:
        return skip("no rank record from this node", **data)
    if not bound["interfaces"]:
        return skip("the ranks recorded no connection of their own", **data)
    shown = ", ".join(bound["interfaces"])
    what = f"gloo ranks bound to {shown} ({', '.join(bound['addresses'])})"
    if len(bound["rails"]) > 1 and len({r["device"] for r in bound["rails"].values()}) > 1:
        what += "; rails: " + rails_text(bound["rails"], "local rank")
    if expect in ("ib", "roce"):
        return fail(f"{what}: gloo runs over TCP sockets, {expect} was expected (NCCL on GPUs uses RDMA)", **data)
    if odd := against_majority(facts.node.name, fabrics):
        return fail(f"{odd.message}; {what}", fix=odd.fix, **{**data, **odd.data})
    if rails:
        if off := off_rail(bound["rails"], rails):
            return fail(f"{what}: {off}", fix=RAIL_FIX, **data)
    elif cluster_interface and bound["interfaces"] != [cluster_interface]:
        return fail(f"{what}, not only the cluster interface {cluster_interface}", **data)
    return passed(what, **data)


RAIL_FIX = (
    "Give every node the interfaces cluster_rail_interfaces names, each with an address on its rail's network "
    "(ip -br addr), and leave GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME unset in the job's environment (each rank "
    "binds its rail itself)."
)


def off_rail(bound: dict[str, dict], rails: tuple[str, ...]) -> str:
    """The local ranks whose connections mostly bound another interface than their rail (local rank i: RAILS[i mod
    len]), in words; empty where each is on its own."""
    off = [
        f"local rank {key} bound to {rail['interface']}, not its rail {rails[int(key) % len(rails)]}"
        for key, rail in sorted(bound.items(), key=lambda kv: int(kv[0]))
        if rail["interface"] != rails[int(key) % len(rails)]
    ]
    return "; ".join(off) + (" (cluster_rail_interfaces)" if off else "")
