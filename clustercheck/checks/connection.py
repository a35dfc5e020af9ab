"""What the core stage reports before any check can read facts: the connection, the facts collection itself,
and a failure of clustercheck's own code on one node."""

from __future__ import annotations

import socket
from typing import Any

from clustercheck.checks.registry import declare

CONNECT = declare(
    "connect",
    stage="core",
    scope="node",
    proves="clustercheck reached the node over SSH (host key verified) or locally",
    fix="Check that the node is up, that sshd answers on that port, and the SSH user and key.",
)
declare(
    "facts",
    stage="core",
    scope="node",
    proves="the facts collector ran on the node with its environment's python",
    fix="Look at facts.stderr in the run directory; check that python3 runs on the node.",
)
declare(
    "internal",
    stage="core",
    scope="node",
    proves="clustercheck's own code did not fail on the node (reported only when it did)",
    fix="Report the error with the run directory's report.json.",
)
declare(
    "leftovers",
    stage="core",
    scope="node",
    proves="nothing of an earlier clustercheck run is left on the node past its deadline: its processes are "
    "stopped, its work directory removed",
    fix="Nothing to do: they were stopped and removed. If it recurs, look for a node that froze or lost its "
    "network during an earlier run.",
)


def connect_fix(exc: BaseException, data: dict[str, Any]) -> str:
    """The fix for a connection that failed with EXC (DATA: the address tried): the declared fix (sshd, user, key),
    unless the cause shows another place, such as a name that does not resolve on this machine."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, socket.gaierror):
            name = data.get("hostname") or "the node's address"
            return (
                f"{name} does not resolve to an address on this machine: check its spelling (--hosts, or "
                "ansible_host in the inventory), or add it to DNS or to /etc/hosts here."
            )
        cause = cause.__cause__
    return CONNECT.fix
