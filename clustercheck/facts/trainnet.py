"""The interface and address a node's training traffic leaves through, as the network stage probes it (pure).

The ranks' process group traffic goes where NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME point (the node's environment
files, /etc/environment, /etc/nccl.conf, /etc/profile.d, that a user's torchrun inherits), else over the cluster
interface (the inventory's cluster_interface, the address in cluster_cidr, or the one holding the SSH address).
The network stage runs its TCP rounds, its ports and its samples of the ephemeral range over that address, so a
firewall or a slow link on the network training uses is found there and not on the one SSH uses.

The variables' syntax is their libraries':
- NCCL_SOCKET_IFNAME (NCCL's environment variables, docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html,
  "NCCL_SOCKET_IFNAME"): a comma-separated list of prefixes of interface names; a leading `^` excludes the
  interfaces that match, a leading `=` matches names exactly (`^=` both). NCCL takes the matching interfaces in the
  order the system lists them.
- GLOO_SOCKET_IFNAME (torch.distributed's documentation, "Choosing the network interface to use"; ProcessGroupGloo
  creates one device per name): a comma-separated list of exact interface names, used in the order given.
"""

from __future__ import annotations

from dataclasses import dataclass

from clustercheck.facts import parse

NCCL, GLOO = "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"


@dataclass(frozen=True)
class TrainingPath:
    """Where a node's training traffic goes: the interface, its IPv4 address, and why that one."""

    interface: str | None
    address: str
    why: str
    variable: str | None = None  # the variable that chose it (None: the cluster interface)
    elsewhere: bool = False  # another address than the one SSH reaches the node at


def selected(variable: str, value: str, interfaces: list[str]) -> list[str]:
    """The INTERFACES (names in the node's order) that VARIABLE=VALUE selects, in the order the library uses them:
    NCCL's prefixes (or exact names with `=`; `^` excludes, and then never loopback) in the node's order, gloo's
    exact names in the order listed."""
    exclude, exact, names = parse.parse_ifname_list(value)
    if not names:
        return []
    if variable == GLOO:
        return [name for name in names if name in interfaces]

    def hit(iface: str) -> bool:
        return any(iface == n or (not exact and iface.startswith(n)) for n in names)

    if exclude:
        return [i for i in interfaces if not hit(i) and i != "lo"]
    return [i for i in interfaces if hit(i)]


def training_path(
    settings: list[tuple[str, str, str]],
    addresses: list[tuple[str, str]],
    cluster: tuple[str | None, str],
    ssh_address: str,
    gpus: int,
) -> TrainingPath:
    """The path of a node's training traffic. SETTINGS: (where, variable, value) of the node's NCCL_*/GLOO_*
    assignments in the order read (the last of a variable wins); ADDRESSES: (interface, IPv4 address) in the
    node's order; CLUSTER: its cluster interface and address; SSH_ADDRESS: the address it is reached at; GPUS: the
    GPUs torch uses there (NCCL's variable first on a GPU node, gloo's first on a CPU node). A variable that
    selects no interface with an address is left to env.launch to judge: the cluster interface is probed then."""
    interface, address = cluster
    order = (NCCL, GLOO) if gpus else (GLOO, NCCL)
    latest = {variable: (where, value) for where, variable, value in settings if variable in order}
    names = list(dict.fromkeys(iface for iface, _ in addresses))
    for variable in order:
        if variable not in latest:
            continue
        where, value = latest[variable]
        chosen = selected(variable, value, names)
        if not chosen:
            continue
        first = chosen[0]
        if first == interface:
            why = f"{where} sets {variable}={value}: the cluster interface"
            return TrainingPath(interface, address, why, variable, address != ssh_address)
        mine = next(a for iface, a in addresses if iface == first)
        why = f"{where} sets {variable}={value}: the training traffic leaves through {first}, not {interface}"
        return TrainingPath(first, mine, why, variable, mine != ssh_address)
    if address != ssh_address:
        why = f"the cluster interface {interface}, not the SSH address {ssh_address}"
        return TrainingPath(interface, address, why, elsewhere=True)
    return TrainingPath(interface, address, f"the cluster interface {interface}, which holds the SSH address")
