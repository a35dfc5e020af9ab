"""The RDMA fabric (InfiniBand and RoCE) as the node exposes it in /sys/class/infiniband, no extra tools: every
port up at the rate its peers run at, and nvidia-peermem loaded where GPUs and RDMA ports share a node."""

from __future__ import annotations

from collections import Counter
from typing import Any

from clustercheck.checks.registry import Finding, cluster_check, fail, node_check, passed, skip, warn
from clustercheck.facts.model import NodeFacts

PEERMEM_MODULES = ("nvidia_peermem", "nv_peer_mem")  # the driver's module, and Mellanox's older one


@node_check(
    "fabric.ports",
    proves="every InfiniBand/RoCE port in /sys/class/infiniband is ACTIVE with its physical link up (WARN for some "
    "ports down, FAIL for all)",
    fix="A port that is DOWN or Polling has no link (cable, switch port, transceiver); INIT means no subnet "
    "manager has configured it (start opensm or check the fabric's SM). Compare with `ibstat`.",
    reads=("rdma_ports",),
)
def fabric_ports(facts: NodeFacts) -> Finding:
    ports = facts.rdma_ports or []
    if not ports:
        return skip("no InfiniBand or RoCE device on this node")
    data = {
        p.name: {"state": p.state, "phys_state": p.phys_state, "rate": p.rate, "link_layer": p.link_layer}
        for p in ports
    }
    down = [f"{p.name} {p.state}/{p.phys_state}" for p in ports if not p.active]
    if down:
        message = f"{len(down)} of {len(ports)} RDMA port(s) not active: {', '.join(down)}"
        if len(down) == len(ports):
            return fail(message, ports=data)
        return warn(message + " (a port left uncabled on purpose can be ignored)", ports=data)
    kinds = ", ".join(f"{p.name} {_kind(p.link_layer)} {p.rate}" for p in ports)
    return passed(f"{len(ports)} RDMA port(s) active: {kinds}", ports=data)


def _kind(link_layer: str | None) -> str:
    return "RoCE" if link_layer == "Ethernet" else (link_layer or "?")


@node_check(
    "fabric.peermem",
    proves="where GPUs and active RDMA ports share a node, nvidia-peermem is loaded, so NCCL can use GPUDirect "
    "RDMA (the NIC reads GPU memory directly)",
    fix="modprobe nvidia-peermem, and load it at boot (echo nvidia-peermem > /etc/modules-load.d/nvidia-peermem.conf); "
    "it ships with the NVIDIA driver (or use the DMA-BUF path of a recent kernel and NCCL).",
    reads=("rdma_ports", "modules"),
    needs_gpu=True,
)
def fabric_peermem(facts: NodeFacts) -> Finding:
    active = [p.name for p in facts.rdma_ports or [] if p.active]
    if not active:
        return skip("no active RDMA port on this node")
    loaded = [m for m in PEERMEM_MODULES if m in (facts.modules or [])]
    if not loaded:
        return warn(
            f"GPUs and active RDMA ports ({', '.join(active)}) but nvidia-peermem is not loaded: NCCL runs "
            "without GPUDirect RDMA, through host memory",
            ports=active,
        )
    return passed(f"{loaded[0]} loaded for GPUDirect RDMA over {', '.join(active)}", module=loaded[0])


@cluster_check(
    "consistency.fabric_rate",
    proves="every active InfiniBand/RoCE port runs at the rate the same port (device:port) runs at on the other "
    "nodes (a port at half rate is named)",
    fix="A port below its peers' rate trained down: reseat or replace the cable or transceiver, check the switch "
    "port (ibportstate, or the switch's own tools).",
)
def fabric_rate(nodes: list[NodeFacts], config: Any) -> Finding:
    from clustercheck.checks.consistency import too_few  # here: importing it above would register it first

    few = too_few(nodes)
    if few:
        return skip(few, rates_gbps={})
    by_port: dict[str, dict[str, float]] = {}
    for n in nodes:
        for p in n.rdma_ports or []:
            if p.active and p.rate_gbps:
                by_port.setdefault(p.name, {})[n.host] = p.rate_gbps
    data: dict[str, Any] = {"rates_gbps": by_port}
    if not by_port:
        return skip("no active RDMA port on any node", **data)
    slow = []
    for port, rates in sorted(by_port.items()):
        if len(rates) < 2:
            continue
        (majority, _), *_ = Counter(rates.values()).most_common()
        slow += [(host, port, rate, majority) for host, rate in sorted(rates.items()) if rate != majority]
    data["differ"] = [{"host": h, "port": p, "gbps": r, "others_gbps": m} for h, p, r, m in slow]
    if slow:
        how = ", ".join(f"{h} {p} at {r:g} Gb/s where the other nodes' {p} run at {m:g}" for h, p, r, m in slow)
        return fail(f"RDMA port rates differ: {how}", **data)
    count = sum(len(r) for r in by_port.values())
    rates = sorted({r for v in by_port.values() for r in v.values()})
    return passed(
        f"{count} active RDMA port(s), each at its peers' rate ({', '.join(f'{r:g}' for r in rates)} Gb/s)", **data
    )
