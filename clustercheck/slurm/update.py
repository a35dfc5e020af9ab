"""node-health's scontrol on its own node: the node's state read (scontrol show node), the drain or resume drain.py
decides applied (scontrol update) unless the circuit breaker (breaker.py, on every node's state, read once a drain is
due) holds the drain back, and what was done, or why nothing could be, said in one line each (a refused scontrol
with the command an administrator would run). The same for the nodes `launch --spare` leaves out (drain_nodes)."""

from __future__ import annotations

import shlex
import shutil
from collections.abc import Callable

from clustercheck.model import CheckResult
from clustercheck.slurm import breaker, drain, parse
from clustercheck.slurm.call import SlurmError, call

LEFT_AS_IS = "the node's state in Slurm was left as it is"


def node_state(name: str, say: Callable[[str], None], timeout: Callable[[], float]) -> parse.SlurmNode | None:
    """Node NAME as `scontrol show node` shows it (within TIMEOUT() seconds); None, said why, when it cannot be read.
    Never raises."""
    scontrol = shutil.which("scontrol")
    if scontrol is None:
        say("scontrol not found: the node's state in Slurm was not read or changed")
        return None
    try:
        shown = call([scontrol, "show", "node", name], timeout())
    except SlurmError as exc:
        say(f"{exc}: {LEFT_AS_IS}")
        return None
    if not shown.ok:
        say(f"scontrol show node {name} failed ({shown.cause()}): {LEFT_AS_IS}")
        return None
    try:
        return parse.parse_show_node(shown.stdout, name)
    except parse.ParseError as exc:
        say(f"scontrol show node {name}: {exc}: {LEFT_AS_IS}")
        return None


def jobs_on(name: str, say: Callable[[str], None], timeout: Callable[[], float]) -> list[tuple[str, str]] | None:
    """The jobs Slurm runs on node NAME (squeue -w), each (job id, user id); None, said why, when it cannot be asked.
    Never raises."""
    squeue = shutil.which("squeue") or "squeue"
    try:
        shown = call([squeue, "--noheader", f"--nodelist={name}", "--format=%i|%U"], timeout())
    except SlurmError as exc:
        say(f"{exc}: the jobs on {name} were not read")
        return None
    if not shown.ok:
        say(f"squeue --nodelist={name} failed ({shown.cause()}): the jobs on {name} were not read")
        return None
    return [tuple(line.split("|", 1)) for line in shown.stdout.splitlines() if "|" in line]


def update(
    results: list[CheckResult],
    state: parse.SlurmNode,
    say: Callable[[str], None],
    timeout: Callable[[], float],
    limit: breaker.Limit | None = None,
    resume: bool = True,
) -> breaker.Verdict | None:
    """Drain the node STATE (node_state's) in Slurm when RESULTS hold a FAIL, resume it when they pass and it was
    drained by us; scontrol gets TIMEOUT() seconds. A drain that would put more of a partition's nodes out than
    LIMIT allows (default: breaker.Limit()) is not done: the breaker's Verdict, said, is returned then, and None
    otherwise. RESUME false: a node is only drained (the Epilog judges some checks only, and the others' drain
    stays). Never raises."""
    action = drain.decide(state, results)
    if action is not None and action.state == "resume" and not resume:
        return None
    if action is None:
        _unchanged(state, any(r.status.is_problem for r in results), say)
        return None
    scontrol = shutil.which("scontrol") or "scontrol"
    if action.state == "drain" and not state.drained:  # a drain of ours with a new reason puts no node more out
        verdict = _breaker(state, action, scontrol, limit or breaker.Limit(), say, timeout)
        if verdict is not None:
            return verdict
    try:
        done = call(action.argv(scontrol), timeout())
    except SlurmError as exc:
        say(f"{exc}: {LEFT_AS_IS}")
        return None
    if not done.ok:  # e.g. a user who is not a Slurm operator: an administrator can do it
        say(
            f"scontrol update nodename={state.name} state={action.state} failed ({done.cause()}); "
            f"an administrator can run: {shlex.join(action.argv())}"
        )
        return None
    say(action.describe())
    return None


def drain_nodes(
    problems: dict[str, list[CheckResult]], say: Callable[[str], None], timeout: Callable[[], float]
) -> None:
    """Each node of PROBLEMS (name -> its own FAIL and ERROR results) drained, in turn, as node-health drains its node:
    node_state, then update (the one reason format, the circuit breaker with its default limit), never resumed;
    what was done or why not said in one line each. Never raises."""
    for name, results in problems.items():
        state = node_state(name, say, timeout)
        if state is not None and results:
            update(results, state, say, timeout, resume=False)


def _breaker(
    state: parse.SlurmNode,
    action: drain.Action,
    scontrol: str,
    limit: breaker.Limit,
    say: Callable[[str], None],
    timeout: Callable[[], float],
) -> breaker.Verdict | None:
    """The breaker's verdict when it holds the drain ACTION back (said), None when the drain may go ahead. Every
    node's state is read for it; when it cannot be, the node is not drained: a slurmctld that does not answer
    during a failure on many nodes is when draining them all would do the most harm."""
    read = drain.read_reason(action.reason)
    check = read.check if read is not None else "?"
    nodes, cause = all_nodes(scontrol, timeout())
    if nodes is None:
        say(f"not draining {state.name} for {check}: how many nodes are drained could not be read ({cause})")
        return breaker.Verdict(state.name, check, False, limit=limit)
    verdict = breaker.decide(state, check, nodes, limit)
    if verdict.drain:
        return None
    say(verdict.describe())
    return verdict


def all_nodes(scontrol: str, timeout: float) -> tuple[list[parse.SlurmNode] | None, str | None]:
    """Every node of Slurm's as `scontrol show node` shows them, or None and why they could not be read."""
    try:
        shown = call([scontrol, "show", "node"], timeout)
        if not shown.ok:
            return None, shown.cause()
        return parse.parse_show_nodes(shown.stdout), None
    except (SlurmError, parse.ParseError) as exc:
        return None, str(exc)


def _unchanged(state: parse.SlurmNode, failed: bool, say: Callable[[str], None]) -> None:
    if state.drained and not state.ours and failed:
        say(f"{state.name} is already drained in Slurm ({state.reason or 'no reason'}): its reason was kept")
    elif state.drained and not state.ours:
        say(f"{state.name} stays drained in Slurm: drained by someone else ({state.reason or 'no reason'})")
