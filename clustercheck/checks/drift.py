"""The files the roles manage, compared across the nodes (`consistency.files`). Pure logic.

Every configuration file a role of site.yml writes (clustercheck/remote/managed.py lists them, from the roles' tasks)
is read on every node with its facts; a node whose copy differs from the majority's (another content, or no copy where
most nodes have one) is named with the file, the lines that differ (a unified diff against the majority's copy, where
the text may be shown: a secret is compared by its SHA-256 alone) and the role whose re-run with `--limit NODE` puts
it back (checks/setup_roles.py builds that command from the finding's data). A file no node has, or fewer nodes have
than lack it, is no finding: a role not used, or used on some nodes only (GPU nodes, a server) by design; the lines a
role writes per node by design are left out on the node (managed.py's VARIED_BY says why). The majority is
consistency.py's rule, the one every consistency check names odd nodes by.
"""

from __future__ import annotations

import difflib
from typing import Any

from clustercheck.checks.consistency import majority_of, too_few
from clustercheck.checks.registry import Finding, cluster_check, fail, passed, skip
from clustercheck.facts.managed import Copy, ManagedFiles
from clustercheck.facts.model import NodeFacts
from clustercheck.remote.managed import SLURM_HASH_MARK

CHANGED_SHOWN = 4  # changed lines in the message's first line, per file and node
DIFF_LINES = 16  # lines of each unified diff shown below it (the data has them all)


@cluster_check(
    "consistency.files",
    proves="every configuration file site.yml's roles write (slurm.conf, gres.conf, chrony.conf, nccl.conf, the "
    "cluster's block of /etc/hosts, limits, the environment's requirements, the munge key by its hash, ...) is the "
    "same on every node that has it (but the lines a role writes per node by design), and no node lacks one most "
    "nodes have",
    fix="Re-run the role that writes the file (the message names it) on the node whose copy differs: ansible-playbook "
    "site.yml -i INVENTORY --limit NODE --tags ROLE; it writes the cluster's copy back and restarts what reads it "
    "(slurm.conf: slurmd, through the role's handler). If the change was meant, make it in the role's variables and "
    "re-run the role on every node.",
)
def files(nodes: list[NodeFacts], config: Any) -> Finding:
    known = {n.host: n.managed_files for n in nodes if n.managed_files is not None}
    data: dict[str, Any] = {"not_collected": sorted(n.host for n in nodes if n.managed_files is None)}
    few = too_few(nodes)
    if few:
        return skip(few, **data)
    if len(known) < 2:
        return skip(f"known on {len(known)} of {len(nodes)} nodes, nothing to compare", **data)
    paths = sorted({path for managed in known.values() for path in managed.files})
    drift = [entry for entry in (_drift(path, known) for path in paths) if entry]
    data.update(files=paths, differ=drift)
    data["unreadable"] = {
        path: sorted(h for h, m in known.items() if path in m.files and m.files[path].error) for path in paths
    }
    data["unreadable"] = {path: hosts for path, hosts in data["unreadable"].items() if hosts}
    if not drift:
        return passed(
            f"{len(paths)} file(s) the roles manage are the same on the {len(known)} node(s) that have them", **data
        )
    said = sorted((host, entry["path"], entry) for entry in drift for host in entry["nodes"])
    first = "; ".join(_line(host, entry) for host, _, entry in said)
    details = [line for entry in drift for line in _details(entry)]
    return fail("\n".join([first, *details]), **data)


def _drift(path: str, known: dict[str, ManagedFiles]) -> dict[str, Any] | None:
    """PATH's copies compared: None when every node that could read it has the same (or none has it)."""
    copies: dict[str, Copy | None] = {h: m.files.get(path) for h, m in known.items()}
    readable = {h: c for h, c in copies.items() if c is None or not c.error}
    values = {h: c.sha256 if c else None for h, c in readable.items()}
    if len(set(values.values())) < 2:
        return None
    majority, tie, odd = majority_of(values)
    if majority is None or (tie and None in values.values()):
        return None  # on fewer nodes than not: a role that runs on some nodes by design (GPU nodes, a server)
    role = next(c.role for c in copies.values() if c)
    holders = sorted(h for h, v in values.items() if v == majority)
    reference = next((readable[h] for h in holders if readable[h] is not None), None)
    entry: dict[str, Any] = {
        "path": path,
        "role": role,
        "tie": tie,
        "majority": None if tie else majority,
        "holders": [] if tie else holders,
        "nodes": {h: values[h] for h in odd},
        "diff": {},
        "slurmctld": {},
    }
    if tie:  # no majority: each node against the first node's copy
        reference = readable[odd[0]]
        entry["holders"] = [odd[0]]
    for host in odd:
        if readable[host] is not reference:
            entry["diff"][host] = _diff(path, reference, readable[host], entry["holders"][0], host)
        said = _slurm_said(host, path, known)
        if said:
            entry["slurmctld"][host] = said
    return entry


def _diff(path: str, reference: Copy | None, copy: Copy | None, theirs: str, host: str) -> list[str]:
    """The unified diff of HOST's copy against THEIRS's (the majority's); [] where either text is not shown."""
    if reference is None or copy is None or reference.text is None or copy.text is None:
        return []
    return list(
        difflib.unified_diff(
            reference.text.splitlines(),
            copy.text.splitlines(),
            f"{path} ({theirs})",
            f"{path} ({host})",
            n=1,
            lineterm="",
        )
    )


def _slurm_said(host: str, path: str, known: dict[str, ManagedFiles]) -> str | None:
    """slurmctld's own line on HOST's slurm.conf (its log, on the node that is Slurm's controller), the latest."""
    if not path.endswith("/slurm.conf"):
        return None
    lines = [line for m in known.values() for line in m.slurmctld if f"Node {host} {SLURM_HASH_MARK}" in line]
    return lines[-1].strip() if lines else None


def _line(host: str, entry: dict[str, Any]) -> str:
    """HOST's difference on ENTRY's file, in one clause."""
    path, role = entry["path"], entry["role"]
    others = _names(entry["holders"])
    if entry["tie"] and host == entry["holders"][0]:
        return f"{host}: {path} differs between the nodes, no copy is the majority's (role {role})"
    if entry["nodes"][host] is None:
        return f"{host}: {path} is missing, which {others} have (role {role})"
    against = f"{others}'s copy, no majority" if entry["tie"] else f"the copy of {others}"
    changed = [line for line in entry["diff"].get(host, []) if line[:1] in "+-" and line[:3] not in ("+++", "---")]
    if changed:
        shown = " ".join(changed[:CHANGED_SHOWN]) + (" ..." if len(changed) > CHANGED_SHOWN else "")
        how = f": {shown}"
    else:
        how = ": its SHA-256 differs (compared by hash only: a secret, or too large to show)"
    return f"{host}: {path} differs from {against} (role {role}){how}"


def _details(entry: dict[str, Any]) -> list[str]:
    """The lines below the first: each differing copy's unified diff, and slurmctld's own words where it logs them."""
    lines = []
    for _host, diff in sorted(entry["diff"].items()):
        lines += diff[:DIFF_LINES] + ([f"... ({len(diff) - DIFF_LINES} more lines)"] if len(diff) > DIFF_LINES else [])
    for host, said in sorted(entry["slurmctld"].items()):
        lines.append(f"slurmctld logs for {host}: {said}")
    return lines


def _names(hosts: list[str]) -> str:
    if len(hosts) <= 2:
        return " and ".join(hosts)
    return f"{', '.join(hosts[:-1])} and {hosts[-1]}"
