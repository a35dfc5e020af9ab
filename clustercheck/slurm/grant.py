"""What Slurm can grant a request, decided before it is asked, and why a request waits (pure; allocation.py reads
Slurm and asks).

Before salloc, the partition's nodes as `scontrol show node` shows them (parse.SlurmNode, the reader node-health and
launch --spare use too) and the partitions as `scontrol show partition` shows them: when fewer nodes Slurm gives new
jobs (parse.UNUSABLE, by sinfo(1)'s node state codes) are in the partition than asked, or a node --nodelist names is
one of them, or the partition starts no job, Slurm could only be waited for in vain: that is said at once, each
node with its state and Slurm's reason (who set it, and when), and what to do.

While a request waits, squeue's reason for it (squeue(1)'s JOB REASON CODES) and the jobs that hold the partition's
nodes.
"""

from __future__ import annotations

from clustercheck.slurm.parse import Queued, SlurmNode, SlurmPartition

LISTED = 6  # nodes named in a line at most; the others counted

_WORDS = {
    "DOWN": "down",
    "NOT_RESPONDING": "not responding",
    "MAINT": "in a maintenance reservation",
    "RESERVED": "reserved (an advanced reservation)",
    "INVAL": "invalid (it registered with less than slurm.conf gives it)",
    "FUTURE": "not configured yet (FUTURE)",
}

# squeue(1), JOB REASON CODES: what the common reasons a job waits mean.
_PENDING = {
    "Resources": "the nodes it needs are busy",
    "Priority": "jobs of higher priority are ahead of it",
    "ReqNodeNotAvail": "a node it needs is not available",
    "PartitionNodeLimit": "it asks more nodes than the partition allows a job",
    "PartitionDown": "the partition is down",
    "PartitionInactive": "the partition is inactive",
    "Reservation": "it waits for its reservation",
    "BeginTime": "its start time has not come",
    "Dependency": "it waits for a job it depends on",
}


def state_words(node: SlurmNode) -> str:
    """How Slurm keeps the node out, in words: drained, draining (its job runs on, no new one comes), down, not
    responding, reserved, ... (several joined with `and`)."""
    words = []
    for flag in node.unusable:
        if flag.startswith("DRAIN"):
            words.append("draining" if flag == "DRAINING" or node.runs_job else "drained")
        elif flag.startswith("FAIL"):
            words.append("failing")
        else:
            words.append(_WORDS.get(flag, flag.lower()))
    return " and ".join(dict.fromkeys(words))


def why(node: SlurmNode) -> str:
    """`node2 is drained (PSU swap, ticket 7; root 2026-11-29T01:02:03)`: its state in words, Slurm's reason and who
    set it when, as Slurm gives them."""
    signed = " ".join(part for part in (node.reason_by, node.reason_at) if part)
    detail = "; ".join(part for part in (node.reason, signed) if part)
    return f"{node.name} is {state_words(node)}" + (f" ({detail})" if detail else f" ({'+'.join(node.state)})")


def fix(node: SlurmNode) -> str:
    """What brings the node back, by why Slurm keeps it out."""
    flags = node.unusable
    resume = f"scontrol update nodename={node.name} state=resume"
    if any(f.startswith(("MAINT", "RESERVED")) for f in flags):
        return f"wait for the reservation holding {node.name} to end (scontrol show reservation)"
    if "INVAL" in flags:
        return f"give {node.name} what slurm.conf says it has, or correct slurm.conf (scontrol show node {node.name})"
    if "NOT_RESPONDING" in flags:  # slurmd does not answer: nothing else can be done until it does
        return f"start slurmd on {node.name} (systemctl start slurmd there), then resume it ({resume}) if it stays down"
    return f"resume {node.name} ({resume}) once it is fixed"


def partition_name(asked: str | None, partitions: list[SlurmPartition]) -> str | None:
    """The partition a job goes to: the one asked, else the default (Default=YES); None when neither is known."""
    return asked or next((p.name for p in partitions if p.default), None)


def refusal(
    count: int,
    named: list[str],
    nodes: list[SlurmNode],
    partitions: list[SlurmPartition],
    asked: str | None,
) -> str | None:
    """Why Slurm cannot grant COUNT nodes (or the nodes NAMED, --nodelist's) of partition ASKED (None: the default)
    to a new job, in one line with what to do; None when it can (those nodes may still be busy: then it waits)."""
    name = partition_name(asked, partitions)
    where = f"partition {name}" if name else "the cluster"
    partition = next((p for p in partitions if p.name == name), None)
    if partition is not None and partition.state != "UP":
        return (
            f"Slurm starts no job in {where}: it is {partition.state} (scontrol show partition {name}); ask another "
            f"partition (--partition), or set it up again (scontrol update partitionname={name} state=up)"
        )
    members = [n for n in nodes if name is None or not n.partitions or name in n.partitions]
    if name is not None and partition is None and not members:
        return None  # a partition Slurm does not know: salloc says so itself, at once
    if named:
        return _named_refusal(named, nodes, members, name)
    out = [n for n in members if n.unusable]
    usable = len(members) - len(out)
    if usable >= count:
        return None
    outside = [n for n in nodes if n not in members]
    reasons = [why(n) for n in out] + [f"{n.name} is in {_partitions(n)}, not {name}" for n in outside]
    head = f"Slurm can grant at most {usable} of the {count} nodes asked ({where} has {len(members)})"
    if not usable:
        head = f"Slurm can grant none of the {count} nodes asked ({where} has {len(members)}, none usable)"
    fixes = ([f"ask for --nodes {usable}"] if usable else []) + [fix(n) for n in out[:LISTED]]
    named = f": {_listed(reasons)}" if reasons else ""
    return f"{head}{named}; {', or '.join(fixes) or 'add nodes to ' + where}"


def _named_refusal(named: list[str], nodes: list[SlurmNode], members: list[SlurmNode], name: str | None) -> str | None:
    out = [n for n in members if n.name in named and n.unusable]
    outside = [n for n in nodes if n.name in named and n not in members]
    if not out and not outside:
        return None
    reasons = [why(n) for n in out] + [f"{n.name} is in {_partitions(n)}, not {name}" for n in outside]
    fixes = ["leave them out of --nodelist"] + [fix(n) for n in out[:LISTED]]
    return f"Slurm cannot grant the nodes --nodelist names: {_listed(reasons)}; {', or '.join(fixes)}"


def _partitions(node: SlurmNode) -> str:
    return f"partition{'s' if len(node.partitions) > 1 else ''} {','.join(node.partitions)}"


def _listed(reasons: list[str]) -> str:
    more = len(reasons) - LISTED
    return "; ".join(reasons[:LISTED]) + (f"; and {more} more (sinfo -R)" if more > 0 else "")


def pending(job: str, reason: str, running: list[Queued]) -> str:
    """One line for a request that waits: Slurm's reason (squeue's %r), what it means, and the jobs that hold the
    partition's nodes (RUNNING)."""
    code = reason.split(",", 1)[0].strip()
    meaning = f": {_PENDING[code]}" if code in _PENDING else ""
    held = ", ".join(f"job {q.job} on {q.nodes}" for q in running[:LISTED] if q.nodes)
    more = len(running) - LISTED
    busy = f" ({held}{f' and {more} more' if more > 0 else ''})" if held else ""
    return f"Slurm job {job} waits, reason {reason}{meaning}{busy}"
