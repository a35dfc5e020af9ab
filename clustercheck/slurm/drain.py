"""What `clustercheck node-health --slurm` does to its node in Slurm, decided from the node's state (`scontrol show
node`, parse.py) and the checks' results. Pure: the scontrol commands are health.py's.

A FAIL drains the node with a reason of ours; a healthy run resumes it only when the reason it is drained with is
ours, so a node an administrator drained stays drained. A drain of someone else is never overwritten with ours
either: that reason would be lost, and a later healthy run would resume a node the administrator meant to keep out.

Every reason clustercheck drains a node with is made by reason() here, in one format for other tools to match
(REASON_PATTERN, docs/slurm.md): `clustercheck: CHECK: MESSAGE`, or `clustercheck: CHECK: MESSAGE (+N more)` when N
more checks failed; at most REASON_CHARS characters, a message cut short ending in `...`. CHECK is a check's name
(no spaces or colons); MESSAGE holds none of the characters that scontrol or a log line would misread.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from clustercheck.model import CheckResult
from clustercheck.slurm.parse import REASON_PREFIX, SlurmNode

REASON_CHARS = 120  # of the reason we set; sinfo -R shows about 20, scontrol all of it
_UNSAFE = re.compile(r"[^A-Za-z0-9 _.,:;/+=()<>%@#-]")  # what could break scontrol's parsing or a log line
_CHECK_NAME = re.compile(r"[^A-Za-z0-9_.-]")  # what a check's name may hold in a reason
# A reason of ours, read back: its check, its message (cut short or not) and how many more checks failed.
REASON_PATTERN = re.compile(
    rf"^{re.escape(REASON_PREFIX)} (?P<check>[A-Za-z0-9_.-]+): (?P<message>.*?)(?: \(\+(?P<more>\d+) more\))?$"
)


@dataclass(frozen=True)
class Action:
    """An `scontrol update` for the node: state drain (with the reason) or resume, and why, for the output."""

    state: str  # "drain" or "resume"
    node: str
    reason: str | None = None

    def argv(self, scontrol: str = "scontrol") -> list[str]:
        command = [scontrol, "update", f"nodename={self.node}", f"state={self.state}"]
        return command + ([f"reason={self.reason}"] if self.reason is not None else [])

    def describe(self) -> str:
        if self.state == "drain":
            return f"drained {self.node} in Slurm: {self.reason}"
        return f"resumed {self.node} in Slurm (it was drained by clustercheck, and its checks pass now)"


def reason(check: str, message: str, others: int = 0) -> str:
    """The drain reason for CHECK's MESSAGE: `clustercheck: CHECK: MESSAGE` on one line, short, with nothing in it
    that scontrol or a log would misread (quotes, newlines, control characters); OTHERS: how many more checks
    failed. The one format of every drain of clustercheck's (the health program, the prolog, the epilog, launch)."""
    name = _CHECK_NAME.sub("_", check) or "check"
    more = f" (+{others} more)" if others else ""
    text = " ".join(_UNSAFE.sub(" ", f"{REASON_PREFIX} {name}: {message}").split())
    limit = REASON_CHARS - len(more)
    if len(text) > limit:
        text = text[: limit - 3].rstrip() + "..."
    return text + more


def drain_reason(result: CheckResult, others: int = 0) -> str:
    """reason() for RESULT, its message without the node's name (the node is the one drained)."""
    message = result.message.removeprefix(f"{result.host}: ") if result.host else result.message
    return reason(result.name, message, others)


@dataclass(frozen=True)
class Reason:
    """A drain reason of clustercheck's, read back (read_reason)."""

    check: str
    message: str
    more: int = 0


def read_reason(text: str | None) -> Reason | None:
    """TEXT (a node's reason, without Slurm's `[user@time]`) as one of ours; None when it is not one."""
    match = REASON_PATTERN.match(text or "")
    if match is None:
        return None
    return Reason(match["check"], match["message"], int(match["more"] or 0))


def decide(node: SlurmNode, results: list[CheckResult]) -> Action | None:
    """What to do with NODE after these results: drain it on a FAIL (or ERROR) with the first one's reason, unless
    someone else drained it; resume it when every check passes and the drain is ours; else nothing."""
    failed = [r for r in results if r.status.is_problem]
    if failed:
        reason = drain_reason(failed[0], len(failed) - 1)
        if node.drained and (not node.ours or node.reason == reason):
            return None  # someone else's drain stays as it is; ours already says this
        return Action("drain", node.name, reason)
    if node.drained and node.ours:
        return Action("resume", node.name)
    return None
