"""The node's operating system: memory and disk, limits, time, name resolution and firewall."""

from __future__ import annotations

from typing import Any

from clustercheck.checks.registry import Finding, cluster_check, fail, node_check, passed, skip, warn
from clustercheck.facts.model import COULD_NOT_COLLECT, NodeFacts
from clustercheck.model import Status

MIB = 1 << 20
GIB = 1 << 30
SHM_MINIMUM = 1 * GIB
# Docker's default /dev/shm is 64 MiB: NCCL crashes creating its shared-memory segments (ncclShmOpen) and DataLoader
# workers die with bus errors there (PyTorch's own CI runs its containers with --shm-size=2gb for that reason).
SHM_FAIL_BELOW = 256 * MIB
DISK_WARN_BELOW = 10 * GIB
DISK_FAIL_BELOW = 1 * GIB


@node_check("os.info", proves="the node's OS, kernel, CPUs and memory were read", reads=("os",))
def os_info(facts: NodeFacts) -> Finding:
    info = facts.os
    assert info is not None
    return passed(
        f"{info.pretty_name}, kernel {info.kernel}, {info.cpus} CPU(s), "
        f"{(info.mem_total_bytes or 0) / GIB:.1f} GiB RAM",
        **info.__dict__,
    )


@node_check(
    "shm.size",
    proves="/dev/shm is large enough for NCCL's shared-memory transport and DataLoader workers",
    fix="NCCL and DataLoader workers use /dev/shm: enlarge it (a tmpfs size= option; in containers --shm-size).",
    reads=("shm",),
)
def shm_size(facts: NodeFacts) -> Finding:
    assert facts.shm is not None
    total = facts.shm.total_bytes
    if total < SHM_FAIL_BELOW:
        return fail(
            f"/dev/shm is {total / MIB:.0f} MiB, less than {SHM_FAIL_BELOW / MIB:.0f} MiB: NCCL's shared-memory "
            "transport and DataLoader workers fail there",
            total_bytes=total,
        )
    if total < SHM_MINIMUM:
        return warn(
            f"/dev/shm is {total / GIB:.2f} GiB, less than {SHM_MINIMUM / GIB:.0f} GiB",
            total_bytes=total,
        )
    return passed(f"/dev/shm is {total / GIB:.1f} GiB", total_bytes=total)


@node_check(
    "ulimit.memlock",
    proves="locked memory is unlimited on a node with an RDMA device (InfiniBand/RoCE), as RDMA needs (a node "
    "without one passes, saying so)",
    fix="RDMA (InfiniBand/RoCE) needs pinned memory: set `* - memlock unlimited` in /etc/security/limits.d/ and "
    "LimitMEMLOCK=infinity for services.",
    reads=("memlock",),
)
def ulimit_memlock(facts: NodeFacts) -> Finding:
    assert facts.memlock is not None
    soft = facts.memlock.soft
    data = {"soft": soft, "hard": facts.memlock.hard}
    if soft is None:
        return passed("ulimit -l is unlimited", **data)
    limit = f"ulimit -l is {soft // 1024} KiB"
    ports = facts.rdma_ports
    if ports == []:  # only RDMA pins memory beyond the limit's reach: without a device the limit does not matter
        return passed(f"{limit}: no RDMA device (/sys/class/infiniband), so nothing needs it unlimited", **data)
    if ports is None:
        why = facts.why_missing("rdma_ports")
        detail = COULD_NOT_COLLECT if why == COULD_NOT_COLLECT else f"{COULD_NOT_COLLECT} ({why})"
        return warn(f"{limit}, not unlimited; whether the node has an RDMA device that needs it: {detail}", **data)
    devices = sorted({p.device for p in ports})
    return warn(f"{limit}, not unlimited, on a node with RDMA device(s) {', '.join(devices)}", devices=devices, **data)


@node_check(
    "disk.free",
    proves="the root file system has free space for checkpoints, packages and logs (the temporary directory, /dev/shm "
    "and the other paths a job writes: fs.space)",
    fix="Free space on the root file system (checkpoints, caches, old kernels and core dumps fill it: "
    "du -xsh /* | sort -h).",
    reads=("disks",),
)
def disk_free(facts: NodeFacts) -> Finding:
    assert facts.disks is not None
    free = {s.path: s.free_bytes for s in facts.disks}
    text = ", ".join(f"{path} {_size(n)}" for path, n in free.items())
    short = [s for s in facts.disks if s.free_bytes < DISK_FAIL_BELOW]
    if short:
        # The file system that is short comes first, with its size: a small tmpfs on /tmp reads as such.
        named = ", ".join(f"{s.path} has {_size(s.free_bytes)} free of {_size(s.total_bytes)}" for s in short)
        return fail(f"low free disk: {named}, less than {_size(DISK_FAIL_BELOW)}", free_bytes=free)
    low = [s for s in facts.disks if s.free_bytes < DISK_WARN_BELOW]
    if low:
        named = ", ".join(f"{s.path} has {_size(s.free_bytes)} free" for s in low)
        return warn(f"low free disk: {named}, less than {_size(DISK_WARN_BELOW)}", free_bytes=free)
    return passed(f"free: {text}", free_bytes=free)


def _size(n: int) -> str:
    return f"{n / GIB:.1f} GiB" if n >= GIB else f"{n / MIB:.0f} MiB"


@node_check(
    "time.sync",
    proves="the clock is synchronized to NTP (timedatectl or chrony)",
    fix="Enable time sync: apt-get install chrony && systemctl enable --now chrony.",
    reads=("time",),  # None only where chronyc hung: the hung-probe rule FAILs it (registry)
)
def time_sync(facts: NodeFacts) -> Finding:
    data: dict = {
        "offset_from_control_s": facts.clock_offset,
        "measurement_error_s": facts.clock_uncertainty,
    }
    state = facts.time
    if state is not None:
        data.update(state.timedatectl)
        if state.chrony is not None:
            data["chrony"] = state.chrony
    if state is None or state.synchronized is None:
        return warn(
            f"time sync state: {COULD_NOT_COLLECT} (no timedatectl or chronyc answer)",
            "Install and enable chrony (the setup playbook does).",
        )
    if not state.synchronized and state.chrony_error:
        # chrony is installed but its daemon does not answer: the node's time service is down, and its clock drifts
        # away from its peers'. On one node that is a warning; across nodes it breaks what compares timestamps.
        status = Status.FAIL if facts.cluster_size > 1 else Status.WARN
        return Finding(
            status,
            f"the clock is not synchronized: chronyd does not answer ({state.chrony_error})",
            "Start the time service and keep it enabled: systemctl enable --now chrony, then check chronyc tracking.",
            data,
        )
    if not state.synchronized:
        return warn("the clock is not synchronized to NTP", **data)
    return passed("clock synchronized to NTP", **data)


@node_check(
    "hostname.resolve",
    proves="the node's hostname resolves to a non-loopback address (torch's rendezvous uses it)",
    fix="Add the node's cluster address for its hostname to /etc/hosts (the setup playbook does).",
    reads=("hostname",),
)
def hostname_resolve(facts: NodeFacts) -> Finding:
    info = facts.hostname
    assert info is not None
    name = info.name
    several = facts.cluster_size > 1
    if info.error or not info.addresses:
        status = Status.FAIL if several else Status.WARN
        return Finding(status, f"hostname {name} {info.error or 'does not resolve'}", None, {"hostname": name})
    addresses = info.addresses
    loopback = [a for a in addresses if a.startswith("127.") or a == "::1"]
    if len(loopback) == len(addresses):
        if not several:
            return warn(
                f"hostname {name} resolves to loopback ({', '.join(addresses)}): fine on one node (its ranks meet "
                "on 127.0.0.1), breaks rendezvous across nodes (a FAIL in a run over several, and in node-health, "
                "which judges a node as one of a cluster's)",
                "Map the hostname to the node's cluster address in /etc/hosts before adding nodes.",
                hostname=name,
                addresses=addresses,
            )
        return fail(
            f"hostname {name} resolves only to loopback ({', '.join(addresses)}); other ranks cannot reach it",
            f"In /etc/hosts, map {name} to the node's cluster address instead of {', '.join(loopback)} (the setup "
            "playbook does).",
            hostname=name,
            addresses=addresses,
        )
    return passed(f"hostname {name} resolves to {', '.join(addresses)}", hostname=name)


@node_check(
    "firewall",
    proves="incoming traffic is filtered on the node: ufw is active, or an nftables or iptables input hook drops or "
    "rejects what its rules do not let in (Docker's or Kubernetes' NAT and FORWARD rules alone filter nothing); no "
    "filter is a FAIL where site.yml's firewall role set the node up (its rules in ufw's rule file), else a WARN",
    fix="Enable a firewall that allows the cluster network only (the setup playbook's firewall role).",
)
def firewall(facts: NodeFacts) -> Finding:
    state = facts.firewall
    if state is None or not state.collected:
        return warn(
            f"firewall state: {COULD_NOT_COLLECT} (ufw, nft and iptables need root)",
            "Run clustercheck as root (ansible_user=root or a user with sudo) to see the firewall.",
        )
    data = dict(state.__dict__)
    if state.active:
        return passed(f"incoming traffic is filtered: {state.filter or state.tool}", **data)
    seen = f" ({state.seen})" if state.seen else ""
    message = f"no input filter{seen}: every port is open to every network"
    # The firewall role set this node up (the inventory gives it the role, and the node holds the role's rules in
    # ufw's rule file), and nothing filters now: ufw was disabled since. A node the role never ran on only warns.
    if facts.node.firewall_role and facts.firewall_role_rules:
        return fail(
            f"{message}, though site.yml's firewall role set up this node's firewall (its rules are in ufw's "
            "rule file, ufw is not active)",
            "Run the firewall role again (ansible-playbook site.yml --tags firewall), or find what disabled ufw.",
            managed=True,
            **data,
        )
    return warn(message, managed=False, **data)


# The base role's values (roles/base/defaults/main.yml, base_sysctl; a test keeps them equal), enough for a few
# thousand nodes; larger clusters get more.
NEIGH_BASE = {
    "net.ipv4.neigh.default.gc_thresh1": 8192,
    "net.ipv4.neigh.default.gc_thresh2": 16384,
    "net.ipv4.neigh.default.gc_thresh3": 32768,
}


def neigh_settings(nodes: int) -> dict[str, int]:
    """The thresholds for NODES: the base role's, or for a larger cluster gc_thresh1 the next power of two at or
    above twice the nodes, gc_thresh2 twice that and gc_thresh3 four times."""
    low = max(NEIGH_BASE["net.ipv4.neigh.default.gc_thresh1"], 1 << (2 * nodes - 1).bit_length())
    return {
        "net.ipv4.neigh.default.gc_thresh1": low,
        "net.ipv4.neigh.default.gc_thresh2": 2 * low,
        "net.ipv4.neigh.default.gc_thresh3": 4 * low,
    }


def _neigh_fix(nodes: int) -> str:
    lines = "; ".join(f"{key} = {value}" for key, value in neigh_settings(nodes).items())
    return (
        f"Write {lines} to /etc/sysctl.d/90-clustercheck.conf on the named nodes (the setup playbook's base role "
        "writes them) and run `sysctl --system`."
    )


@cluster_check(
    "neighbour.table",
    proves="every node's kernel neighbour (ARP) table holds an entry for every node of the run with room to spare "
    "(net.ipv4.neigh.default.gc_thresh2 at least the number of nodes, gc_thresh3 at least twice it), and no node's "
    "kernel log says the table overflowed",
    fix=_neigh_fix(1),
)
def neighbour_table(nodes: list[NodeFacts], config: Any) -> Finding:
    """Past gc_thresh3 the kernel drops new neighbours ("neighbor table overflow!"): connections to some nodes fail
    at random, seen as flaky NCCL; past gc_thresh2 it evicts entries every 5 s. A node talks to every other node,
    on each network it shares with them, so a cluster of N nodes needs N entries per network at the least."""
    count = len(nodes)
    overflowed: dict[str, list[str]] = {}
    small, shared, unknown = [], [], []
    for facts in nodes:
        lines = facts.neighbour_overflows or []  # parsed with the log: the whole log is not kept past the node
        if lines:
            overflowed[facts.host] = lines
        limits = facts.neigh
        if limits is None:
            unknown.append(facts.host)
        elif limits.gc_thresh3 is None or limits.gc_thresh2 is None:
            shared.append(facts.host)
        elif limits.gc_thresh2 < count or limits.gc_thresh3 < 2 * count:
            small.append(f"{facts.host} (gc_thresh2 {limits.gc_thresh2}, gc_thresh3 {limits.gc_thresh3})")
    data: dict[str, Any] = {
        "nodes": count,
        "overflowed": overflowed,
        "too_small": small,
        "host_namespace": shared,
        "not_collected": unknown,
        "differ": sorted(set(overflowed) | {entry.split(" ", 1)[0] for entry in small}),  # the nodes to fix
    }
    fix = _neigh_fix(count)
    if not nodes:
        return skip("no node reached, nothing to check", **data)
    if overflowed:
        said = "; ".join(
            f"{host}: {_times(len(lines))}, last: {lines[-1]}" for host, lines in sorted(overflowed.items())
        )
        return fail(
            f"the kernel's neighbour table overflowed, so connections to some nodes fail at random: {said}",
            fix=fix,
            **data,
        )
    if small:
        return warn(
            f"neighbour table too small for {count} nodes on {', '.join(small)}: at least gc_thresh2 "
            f"{count} and gc_thresh3 {2 * count}",
            fix=fix,
            **data,
        )
    if unknown and len(unknown) + len(shared) == count:  # no node's limits were read: nothing to say "room" of
        return warn(f"neighbour table limits: {COULD_NOT_COLLECT} on {', '.join(unknown)}", fix=fix, **data)
    if len(shared) == count:
        return skip(
            "neighbour table limits not shown in the nodes' network namespaces (containers share their host's "
            "table); no overflow in the kernel log",
            **data,
        )
    notes = []
    if shared:
        notes.append(f"not shown on {', '.join(shared)} (a container's namespace)")
    if unknown:
        notes.append(f"{COULD_NOT_COLLECT} on {', '.join(unknown)}")
    more = f" ({'; '.join(notes)})" if notes else ""
    nodes_said = "1 node" if count == 1 else f"{count} nodes"
    return passed(f"room for {nodes_said} in every node's neighbour table, no overflow{more}", **data)


def _times(count: int) -> str:
    return "once" if count == 1 else f"{count} times"
