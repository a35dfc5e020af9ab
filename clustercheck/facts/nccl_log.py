"""NCCL's NCCL_DEBUG=INFO output, read: the network NCCL chose (InfiniBand, RoCE, sockets, a net plugin such as AWS's
Libfabric/EFA), its devices, GPUDirect RDMA, the paths inside the node, and the rail map: which HCA or interface
each GPU's inter-node channels went through. Pure parsing (checks/nccl_net.py judges).

Every line NCCL writes starts `host:pid:tid [cudaDev] NCCL INFO ...` (anything before the host, such as mpirun's
`[1,0]<stdout>:`, is ignored): the [cudaDev] is the GPU of the rank that wrote it. A channel line
(`Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0/GDRDMA`) names the net and the index of the device in that
process's device list (`NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ...`, with NCCL >= 2.20's merged NICs
`[0]={[0] mlx5_2:1/RoCE, [1] mlx5_3:1/RoCE}`; `NET/Socket : Using [0]eth0:10.0.0.1<0>`; a plugin names its devices
in `NET/<net> : GPU Direct RDMA Enabled for HCA <index> '<name>'`); /GDRDMA means GPUDirect RDMA."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

LINE = re.compile(r"(?:^|[^\w.-])(?P<host>[\w.<>-]+):(?P<pid>\d+):\d+ \[(?P<dev>\d+)\] NCCL INFO ")
NET_IB_USING = re.compile(r"NET/IB ?: Using (?P<list>.*?)(?:; OOB (?P<oob>[^:\s]+):(?P<addr>\S+?)<\d+>)?\s*$")
HCA = re.compile(r"\[\d+\] ?(?P<hca>[\w.-]+:\d+)/(?P<layer>IB|RoCE)")
IB_DEVICE = re.compile(
    r"\[(?P<index>\d+)\](?:=\{(?P<merged>[^}]*)\}|(?P<name>[\w.-]+):(?P<port>\d+)/(?P<layer>IB|RoCE))"
)
MERGED_PART = re.compile(r"(?P<name>[\w.-]+):(?P<port>\d+)/(?P<layer>IB|RoCE)")
NET_SOCKET_USING = re.compile(r"NET/Socket : Using (?P<list>.*)$")
SOCKET_IF = re.compile(r"\[(?P<index>\d+)\](?P<iface>[^:\s]+):(?P<addr>\S+?)<\d+>")
USING_NETWORK = re.compile(r"NCCL INFO Using network (?P<net>\S.*?)\s*$")
CHANNEL_NET = re.compile(r"NCCL INFO Channel .* via NET/(?P<net>[^/]+)/(?P<index>\d+)(?P<rest>/\S*)?")
CHANNEL_VIA = re.compile(r"NCCL INFO Channel .* via (?P<path>\S+(?: pointer)?(?:/\S+)?)")
GDR_STATE = re.compile(
    r"NET/(?P<net>[^:]+?) ?: GPU Direct RDMA (?P<state>Enabled|Disabled) for HCA (?P<index>\d+) '(?P<hca>[^']+)'"
)
OFI_PROVIDER = re.compile(r"NET/OFI Selected [Pp]rovider is (?P<provider>[\w-]+)")
IB_DISABLE = re.compile(r"NCCL_IB_DISABLE set by environment to (?P<value>\d+)")
NO_IB_DEVICE = re.compile(r"NET/IB ?: No device found")


@dataclass(frozen=True)
class NetDevice:
    """One entry of a net's device list: an HCA (name:port and its link layer) or an interface."""

    name: str
    port: int | None = None
    layer: str | None = None  # IB or RoCE for NET/IB's devices
    interface: str | None = None  # the interface of a NET/Socket device


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
    provider: str | None = None  # a Libfabric plugin's provider (NET/OFI Selected Provider is efa)
    # (pid, net) -> {index: device}: each process's device lists; "" as the pid for a line without the prefix
    devices: dict[tuple[str, str], dict[int, NetDevice]] = field(default_factory=dict)
    # GPU (cudaDev) -> Counter of (pid, net, index, gdr) over its inter-node channels
    gpu_channels: dict[int, Counter] = field(default_factory=dict)

    @property
    def lines_seen(self) -> bool:
        return bool(self.networks or self.channel_nets or self.intra or self.hcas or self.socket_ifaces)

    @property
    def network(self) -> str | None:
        """ib, roce, ib+roce, socket, efa (a Libfabric plugin's provider), or another network's name; None when the
        log does not say."""
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
        if self.provider:
            return self.provider.lower()
        return net.lower()

    @property
    def gdr(self) -> bool | None:
        """Whether the inter-node channels use GPUDirect RDMA; None with no inter-node channel."""
        if not self.channel_nets:
            return False if self.gdr_disabled else None
        return self.gdr_channels > 0

    def device(self, pid: str, net: str, index: int) -> NetDevice | None:
        """Device INDEX of NET as process PID listed it (else as any process of the node did)."""
        family = "IB" if net.startswith("IB") else net
        if (found := self.devices.get((pid, family), {}).get(index)) is not None:
            return found
        for (_, listed), devices in sorted(self.devices.items()):
            if listed == family and index in devices:
                return devices[index]
        return None

    def kind(self, net: str, device: NetDevice | None) -> str:
        """IB, RoCE, Socket, EFA (or the plugin's provider, upper case), or the net's own name."""
        if net.startswith("IB"):
            return device.layer if device and device.layer else "IB"
        if net == "Socket":
            return "Socket"
        if self.provider:
            return self.provider.upper()
        return net


def parse_nccl_log(text: str) -> NcclTransport:
    """NCCL_DEBUG=INFO output (any number of ranks, any prefix before the host:pid:tid) -> NcclTransport."""
    found = NcclTransport()
    for line in text.splitlines():
        if "NCCL INFO" not in line:
            continue
        prefix = LINE.search(line)
        pid, gpu = (prefix["pid"], int(prefix["dev"])) if prefix else ("", None)
        if match := NET_IB_USING.search(line):
            _ib_devices(found, pid, match)
        elif match := NET_SOCKET_USING.search(line):
            listed = found.devices.setdefault((pid, "Socket"), {})
            for iface in SOCKET_IF.finditer(match["list"]):
                listed[int(iface["index"])] = NetDevice(iface["iface"], interface=iface["iface"])
                if iface["iface"] not in found.socket_ifaces:
                    found.socket_ifaces.append(iface["iface"])
        elif match := USING_NETWORK.search(line):
            found.networks.append(match["net"])
        elif match := CHANNEL_NET.search(line):
            _channel(found, pid, gpu, match)
        elif match := CHANNEL_VIA.search(line):
            found.intra[_intra_kind(match["path"])] += 1
        elif match := GDR_STATE.search(line):
            _gdr_state(found, pid, match)
        elif match := OFI_PROVIDER.search(line):
            found.provider = match["provider"]
        elif match := IB_DISABLE.search(line):
            found.ib_disabled = match["value"] != "0"
        elif NO_IB_DEVICE.search(line):
            found.no_ib_device = True
    return found


def _ib_devices(found: NcclTransport, pid: str, match: re.Match) -> None:
    for hca in HCA.finditer(match["list"]):
        found.hcas[hca["hca"]] = hca["layer"]
    found.oob = match["oob"] or found.oob
    listed = found.devices.setdefault((pid, "IB"), {})
    for entry in IB_DEVICE.finditer(match["list"]):
        if entry["merged"] is not None:  # one NCCL device made of several ports (NCCL_IB_MERGE_NICS)
            parts = list(MERGED_PART.finditer(entry["merged"]))
            if parts:
                name = "+".join(p["name"] for p in parts)
                listed[int(entry["index"])] = NetDevice(name, int(parts[0]["port"]), parts[0]["layer"])
        else:
            listed[int(entry["index"])] = NetDevice(entry["name"], int(entry["port"]), entry["layer"])


def _channel(found: NcclTransport, pid: str, gpu: int | None, match: re.Match) -> None:
    net = match["net"]
    gdr = "GDRDMA" in (match["rest"] or "").split("/")
    found.channel_nets["IB" if net.startswith("IB") else net] += 1
    if gdr:
        found.gdr_channels += 1
    if gpu is not None:
        found.gpu_channels.setdefault(gpu, Counter())[(pid, net, int(match["index"]), gdr)] += 1


def _gdr_state(found: NcclTransport, pid: str, match: re.Match) -> None:
    if match["state"] == "Disabled" and match["hca"] not in found.gdr_disabled:
        found.gdr_disabled.append(match["hca"])
    net = match["net"]
    if net.startswith("IB") or net == "Socket":
        return  # their Using lines list them with ports and layers
    found.devices.setdefault((pid, net), {}).setdefault(int(match["index"]), NetDevice(match["hca"]))


def _intra_kind(path: str) -> str:
    """P2P/IPC/read -> P2P/IPC, 'P2P/direct pointer/read' -> P2P/direct, SHM/direct/direct -> SHM."""
    parts = path.split("/")
    if parts[0] == "P2P" and len(parts) > 1:
        return "P2P/" + parts[1].split()[0]
    return parts[0]


def rail_map(t: NcclTransport) -> dict[str, dict]:
    """Each GPU's inter-node rail: {"0": {"device", "port", "kind", "gdr", "interface", "channels"}} keyed by the
    GPU index (cudaDev, as text, as the report's JSON keys are), the device its most channels went through; a GPU
    whose channels went through several devices also lists them all ("devices")."""
    rails: dict[str, dict] = {}
    for gpu, channels in sorted(t.gpu_channels.items()):
        per_device: Counter = Counter()
        gdr: dict[str, bool] = {}
        described: dict[str, dict] = {}
        for (pid, net, index, uses_gdr), n in channels.items():
            device = t.device(pid, net, index)
            name = device.name if device else f"NET/{net}/{index}"
            per_device[name] += n
            gdr[name] = gdr.get(name, False) or uses_gdr
            described.setdefault(
                name,
                {
                    "device": name,
                    "port": device.port if device else None,
                    "kind": t.kind(net, device),
                    "interface": device.interface if device else None,
                },
            )
        name = per_device.most_common(1)[0][0]
        rail = {**described[name], "gdr": gdr[name], "channels": sum(per_device.values())}
        if len(per_device) > 1:
            rail["devices"] = sorted(per_device)
        rails[str(gpu)] = rail
    return rails
