"""What the core stage reports before any check can read facts: the connection, the facts collection itself,
and a failure of clustercheck's own code on one node."""

from __future__ import annotations

import os
import socket
from typing import Any

from clustercheck.checks.registry import Finding, declare, fail, passed, skip, warn
from clustercheck.transport import SessionQuirks

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
    """The fix for a connection that failed with EXC (DATA: the address tried): the transport's own (a Slurm job
    step's: slurmd, munge), else the declared fix (sshd, user, key), unless the cause shows another place, such as a
    name that does not resolve on this machine."""
    own = getattr(exc, "fix", None)
    if own:
        return own
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


declare(
    "ssh.session",
    stage="core",
    scope="node",
    proves="the node's SSH server runs commands as tools expect: its login shell prints nothing before a command's "
    "own output (sftp, scp and rsync need that); a limit on sessions per connection (MaxSessions) is named",
    fix="Make the login shell's startup files print only in interactive shells.",
)

# The file each login shell reads when sshd runs a command (not interactive, not a login shell): where the text that
# comes before every command's output is printed. bash reads ~/.bashrc when sshd starts it (Debian and Ubuntu also
# /etc/bash.bashrc, which returns at once in a shell that is not interactive).
STARTUP_FILES = {
    "bash": "~/.bashrc",
    "zsh": "~/.zshenv",
    "tcsh": "~/.tcshrc (or ~/.cshrc)",
    "csh": "~/.cshrc",
    "fish": "~/.config/fish/config.fish",
}


def session_finding(quirks: SessionQuirks, shell: str | None) -> Finding:
    """ssh.session on what the transport learnt about the node's sshd; SHELL: the SSH user's login shell ($SHELL)."""
    data: dict[str, Any] = {
        "sessions_limited": quirks.sessions_limited,
        "connections": quirks.connections,
        "startup_output": quirks.startup_output[:2000] or None,
        "shell": shell,
    }
    limit = ""
    if quirks.sessions_limited:
        limit = (
            "; sshd refused more sessions on one connection (MaxSessions in its sshd_config): clustercheck used "
            f"{quirks.connections} connection(s)"
        )
    if not quirks.startup_output:
        return passed(f"commands run with nothing printed before their output{limit}", **data)
    base = os.path.basename(shell or "")
    where = STARTUP_FILES.get(base)
    said = quirks.startup_output.strip().splitlines()[0][:120]
    source = f"its startup file {where}" if where else "its startup files"
    return warn(
        f"the login shell ({shell or 'unknown'}) prints text before every command's output ({source}): "
        f"{said!r}: sftp, scp and rsync fail on this node; clustercheck read past it{limit}",
        f"Make {where or 'the shell startup files'} of the SSH user print only in interactive shells: move the "
        "output (echo, a module system's banner, conda's activation messages) under `if [[ $- == *i* ]]; then ... "
        "fi` (bash), or to the login files or the MOTD, which sshd shows only to interactive logins.",
        **data,
    )


declare(
    "nodes.distinct",
    stage="core",
    scope="cluster",
    proves="every inventory name is a different machine (no two names share the machine ID, boot ID and hostname), "
    "read by the first command on each, so N names are N nodes",
    fix="Remove the second name of that machine from the inventory, or give it the address of the machine it was "
    "meant to name (ansible_host); until then the multi-node stages do not run.",
)


def distinct_finding(names: list[str], addresses: dict[str, str], same: dict[str, str], identities) -> Finding:
    """nodes.distinct over the inventory NAMES (in order): SAME maps a name found to be another name's machine to
    the name that was checked in its place; IDENTITIES: name -> facts.parse.Identity where it was read."""
    unknown = [n for n in names if identities.get(n) is None or identities[n].key is None]
    data: dict[str, Any] = {"same_machine": dict(same), "not_read": unknown}
    if len(names) < 2:
        return skip("one node, nothing to compare", **data)
    if len(unknown) == len(names):  # no machine to tell apart: nothing judged, nothing passed
        reached = [n for n in names if n in identities]
        why = f"the identity of no node could be read (reached: {', '.join(reached)})" if reached else "no node reached"
        return skip(f"{why}, nothing to compare", **data)
    if not same:
        note = f" (not read on {', '.join(unknown)})" if unknown else ""
        return passed(
            f"{len(names) - len(unknown)} names, as many machines (machine ID, boot ID and hostname){note}", **data
        )
    groups: dict[str, list[str]] = {}
    for name in names:  # the name checked, and every name found to be its machine, in inventory order
        checked = same.get(name, name)
        if name in same or checked in same.values():
            groups.setdefault(checked, []).append(name)
    parts = []
    for checked, group in groups.items():
        ident = identities[checked]
        listed = " and ".join(f"{n} ({addresses.get(n, '?')})" for n in group)
        parts.append(
            f"{listed} are one machine (machine ID {ident.machine_id or 'unknown'}, boot ID {ident.boot_id}, hostname "
            f"{ident.hostname or 'unknown'}): checked once, as {checked}"
        )
    machines = len(names) - len(same)
    return fail(f"{'; '.join(parts)}; the inventory names {len(names)} nodes, they are {machines} machines", **data)
