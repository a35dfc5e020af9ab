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
    proves="every InfiniBand/RoCE port in /sys/class/infiniband is ACTIVE with its physical link up",
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
        return fail(f"{len(down)} of {len(ports)} RDMA port(s) not active: {', '.join(down)}", ports=data)
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
    proves="every active InfiniBand/RoCE port of every node runs at the same rate (a port at half rate is named)",
    fix="A port below its peers' rate trained down: reseat or replace the cable or transceiver, check the switch "
    "port (ibportstate, or the switch's own tools).",
)
def fabric_rate(nodes: list[NodeFacts], config: Any) -> Finding:
    rates = {(n.host, p.name): p.rate_gbps for n in nodes for p in n.rdma_ports or [] if p.active and p.rate_gbps}
    data: dict[str, Any] = {"rates_gbps": {f"{h} {port}": r for (h, port), r in rates.items()}}
    if not rates:
        return skip("no active RDMA port on any node", **data)
    counts = Counter(rates.values())
    (majority, _), *_ = counts.most_common()
    slow = {key: r for key, r in rates.items() if r != majority}
    data["majority_gbps"] = majority
    if slow:
        how = ", ".join(f"{h} {port} at {r:g} Gb/s" for (h, port), r in sorted(slow.items()))
        return fail(f"RDMA port rates differ: {how}, where the other ports run at {majority:g} Gb/s", **data)
    return passed(f"{len(rates)} active RDMA port(s), all at {majority:g} Gb/s", **data)
