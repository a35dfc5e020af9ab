"""node-health's scontrol on its own node: the node's state read (scontrol show node), the drain or resume drain.py
decides applied (scontrol update), and what was done, or why nothing could be, said in one line each."""

from __future__ import annotations

import shutil
from collections.abc import Callable

from clustercheck.model import CheckResult
from clustercheck.slurm import drain, parse
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


def update(
    results: list[CheckResult], state: parse.SlurmNode, say: Callable[[str], None], timeout: Callable[[], float]
) -> None:
    """Drain the node STATE (node_state's) in Slurm when RESULTS hold a FAIL, resume it when they pass and it was
    drained by us; scontrol gets TIMEOUT() seconds. Never raises."""
    action = drain.decide(state, results)
    if action is None:
        _unchanged(state, any(r.status.is_problem for r in results), say)
        return
    scontrol = shutil.which("scontrol") or "scontrol"
    try:
        done = call(action.argv(scontrol), timeout())
    except SlurmError as exc:
        say(f"{exc}: {LEFT_AS_IS}")
        return
    if not done.ok:
        say(f"scontrol update nodename={state.name} state={action.state} failed ({done.cause()})")
        return
    say(action.describe())


def _unchanged(state: parse.SlurmNode, failed: bool, say: Callable[[str], None]) -> None:
    if state.drained and not state.ours and failed:
        say(f"{state.name} is already drained in Slurm ({state.reason or 'no reason'}): its reason was kept")
    elif state.drained and not state.ours:
        say(f"{state.name} stays drained in Slurm: drained by someone else ({state.reason or 'no reason'})")
