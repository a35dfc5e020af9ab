"""The transport the collectives job really used, per node: for NCCL, read from its NCCL_DEBUG=INFO output (the
network it chose: InfiniBand, RoCE or sockets; the HCAs or interfaces; GPUDirect RDMA; the paths inside the
node); for gloo, the local address of the ranks' own TCP connections. Judged against --expect-transport (or the
inventory's clustercheck_expect_transport), else against the hardware the node has. Pure logic."""

from __future__ import annotations

import ipaddress
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from clustercheck.checks.registry import Finding, declare, fail, passed, skip, warn
from clustercheck.facts.model import NodeFacts

TRANSPORT = declare(
    "transport.network",
    stage="collectives",
    scope="node",
    proves="the multi-node collectives ran over the transport expected (--expect-transport, or the node's "
    "hardware): NCCL's network (IB, RoCE, sockets), HCAs or interfaces, GPUDirect RDMA and intra-node paths "
    "from its INFO log; for gloo, the interface the ranks' connections bound to",
    fix="For NCCL on sockets where InfiniBand/RoCE exists: unset NCCL_IB_DISABLE, install the RDMA libraries "
    "(rdma-core/libibverbs), load nvidia-peermem for GPUDirect RDMA; for a wrong interface, set "
    "NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME to the cluster interface (cluster_interface in the inventory).",
)

NET_IB_USING = re.compile(r"NET/IB ?: Using (?P<list>.*?)(?:; OOB (?P<oob>[^:\s]+):(?P<addr>\S+?)<\d+>)?\s*$")
HCA = re.compile(r"\[\d+\](?P<hca>[\w.-]+:\d+)/(?P<layer>IB|RoCE)")
NET_SOCKET_USING = re.compile(r"NET/Socket : Using (?P<list>.*)$")
SOCKET_IF = re.compile(r"\[\d+\](?P<iface>[^:\s]+):(?P<addr>\S+?)<\d+>")
USING_NETWORK = re.compile(r"NCCL INFO Using network (?P<net>\S+)")
CHANNEL_VIA = re.compile(r"NCCL INFO Channel .* via (?P<path>\S+(?: pointer)?(?:/\S+)?)")
GDR_STATE = re.compile(r"GPU Direct RDMA (?P<state>Enabled|Disabled) for HCA \d+ '(?P<hca>[^']+)'")
IB_DISABLE = re.compile(r"NCCL_IB_DISABLE set by environment to (?P<value>\d+)")
NO_IB_DEVICE = re.compile(r"NET/IB ?: No device found")


@dataclass
class NcclTransport:
    """What one node's NCCL INFO output says about the transports it used."""

    networks: list[str] = field(default_factory=list)  # "Using network X" (IB, Socket, IBext_v8, ...)
    channel_nets: Counter = field(default_factory=Counter)  # inter-node channels per net: IB, Socket, ...
    gdr_channels: int = 0  # inter-node channels via .../GDRDMA
    hcas: dict[str, str] = field(default_factory=dict)  # mlx5_0:1 -> IB or RoCE
    socket_ifaces: list[str] = field(default_factory=list)  # NET/Socket's interfaces
    oob: str | None = None  # NET/IB's out-of-band (bootstrap) interface
    gdr_disabled: list[str] = field(default_factory=list)  # HCAs NCCL says it cannot use GPUDirect RDMA with
    intra: Counter = field(default_factory=Counter)  # P2P/IPC, P2P/direct, P2P/CUMEM, SHM, NVLS, ...
    ib_disabled: bool = False  # NCCL_IB_DISABLE=1 in its environment
    no_ib_device: bool = False  # NET/IB : No device found

    @property
    def lines_seen(self) -> bool:
        return bool(self.networks or self.channel_nets or self.intra or self.hcas or self.socket_ifaces)

    @property
    def network(self) -> str | None:
        """ib, roce, ib+roce, socket, or another network's name; None when the log does not say."""
        if self.channel_nets:
            net = self.channel_nets.most_common(1)[0][0]
        elif self.networks:
            net = Counter(self.networks).most_common(1)[0][0]
        elif self.hcas:  # NCCL before 2.6 names no network: NET/IB listing its HCAs means it took IB
            net = "IB"
        elif self.socket_ifaces:
            net = "Socket"
        else:
            return None
        if net.startswith("IB"):
            layers = set(self.hcas.values())
            if layers == {"RoCE"}:
                return "roce"
            if layers == {"IB", "RoCE"}:
                return "ib+roce"
            return "ib"
        if net == "Socket":
            return "socket"
        return net.lower()

    @property
    def gdr(self) -> bool | None:
        """Whether the inter-node channels use GPUDirect RDMA; None with no inter-node channel."""
        if not self.channel_nets:
            return False if self.gdr_disabled else None
        return self.gdr_channels > 0


def parse_nccl_log(text: str) -> NcclTransport:
    """NCCL_DEBUG=INFO output (any number of ranks, any prefix before the host:pid:tid) -> NcclTransport."""
    found = NcclTransport()
    for line in text.splitlines():
        if "NCCL INFO" not in line:
            continue
        if match := NET_IB_USING.search(line):
            for hca in HCA.finditer(match["list"]):
                found.hcas[hca["hca"]] = hca["layer"]
            found.oob = match["oob"] or found.oob
        elif match := NET_SOCKET_USING.search(line):
            for iface in SOCKET_IF.finditer(match["list"]):
                if iface["iface"] not in found.socket_ifaces:
                    found.socket_ifaces.append(iface["iface"])
        elif match := USING_NETWORK.search(line):
            found.networks.append(match["net"])
        elif match := CHANNEL_VIA.search(line):
            path = match["path"]
            if path.startswith("NET/"):
                parts = path.split("/")
                net = parts[1] if len(parts) > 1 else "?"
                found.channel_nets["IB" if net.startswith("IB") else net] += 1
                if parts[-1] == "GDRDMA":
                    found.gdr_channels += 1
            else:
                found.intra[_intra_kind(path)] += 1
        elif match := GDR_STATE.search(line):
            if match["state"] == "Disabled" and match["hca"] not in found.gdr_disabled:
                found.gdr_disabled.append(match["hca"])
        elif match := IB_DISABLE.search(line):
            found.ib_disabled = match["value"] != "0"
        elif NO_IB_DEVICE.search(line):
            found.no_ib_device = True
    return found


def _intra_kind(path: str) -> str:
    """P2P/IPC/read -> P2P/IPC, 'P2P/direct pointer/read' -> P2P/direct, SHM/direct/direct -> SHM."""
    parts = path.split("/")
    if parts[0] == "P2P" and len(parts) > 1:
        return "P2P/" + parts[1].split()[0]
    return parts[0]


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
    else:
        what = f"NCCL over {network}"
    if not t.channel_nets:
        what += ", no inter-node channel in the log"
    if t.intra:
        what += "; inside the node: " + ", ".join(f"{k}" for k, _ in t.intra.most_common())
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


def judge_nccl(t: NcclTransport, facts: NodeFacts, expect: str | None) -> Finding:
    data: dict[str, Any] = {
        "backend": "nccl",
        "network": t.network,
        "hcas": t.hcas,
        "socket_interfaces": t.socket_ifaces,
        "gpudirect_rdma": t.gdr,
        "gdr_disabled_hcas": t.gdr_disabled,
        "intra_node": dict(t.intra),
        "inter_node_channels": dict(t.channel_nets),
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
    """The local addresses of this node's ranks' established connections (the store's excepted) and the
    interfaces that hold them."""
    addresses: Counter = Counter()
    for record in records:
        for e in record.get("endpoints") or []:
            if e.get("state") != "established" or master_port in (e.get("local_port"), e.get("remote_port")):
                continue
            addresses[e.get("local")] += 1
    by_address = {str(a.address.ip): a.iface for a in facts.addresses or []}
    interfaces: Counter = Counter()
    for address, n in addresses.items():
        iface = by_address.get(str(address)) or ("lo" if _loopback(address) else f"? ({address})")
        interfaces[iface] += n
    return {"addresses": sorted(a for a in addresses if a), "interfaces": [i for i, _ in interfaces.most_common()]}


def _loopback(address: Any) -> bool:
    try:
        return ipaddress.ip_address(str(address)).is_loopback
    except ValueError:
        return False


def judge_gloo(
    records: list[dict], facts: NodeFacts, cluster_interface: str | None, master_port: int, expect: str | None
) -> Finding:
    bound = gloo_interface(records, facts, master_port)
    data: dict[str, Any] = {"backend": "gloo", **bound, "cluster_interface": cluster_interface, "expected": expect}
    if not records:
        return skip("no rank record from this node", **data)
    if not bound["interfaces"]:
        return skip("the ranks recorded no connection of their own", **data)
    shown = ", ".join(bound["interfaces"])
    what = f"gloo ranks bound to {shown} ({', '.join(bound['addresses'])})"
    if expect in ("ib", "roce"):
        return fail(f"{what}: gloo runs over TCP sockets, {expect} was expected (NCCL on GPUs uses RDMA)", **data)
    if cluster_interface and bound["interfaces"] != [cluster_interface]:
        return fail(f"{what}, not only the cluster interface {cluster_interface}", **data)
    return passed(what, **data)
