"""What `clustercheck node-health --slurm` does to its node in Slurm, decided from the node's state (`scontrol show
node`, parse.py) and the checks' results. Pure: the scontrol commands are health.py's.

A FAIL drains the node with a reason of ours (`clustercheck: <check>: <message>`); a healthy run resumes it only
when the reason it is drained with is ours, so a node an administrator drained stays drained. A drain of someone
else is never overwritten with ours either: that reason would be lost, and a later healthy run would resume a node
the administrator meant to keep out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from clustercheck.model import CheckResult
from clustercheck.slurm.parse import REASON_PREFIX, SlurmNode

REASON_CHARS = 120  # of the reason we set; sinfo -R shows about 20, scontrol all of it
_UNSAFE = re.compile(r"[^A-Za-z0-9 _.,:;/+=()<>%@#-]")  # what could break scontrol's parsing or a log line


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


def drain_reason(result: CheckResult, others: int = 0) -> str:
    """`clustercheck: <check>: <message>` on one line, short, with nothing in it that scontrol or a log would
    misread (quotes, newlines, control characters); OTHERS: how many more checks failed."""
    message = result.message.removeprefix(f"{result.host}: ") if result.host else result.message
    more = f" (+{others} more)" if others else ""
    text = " ".join(_UNSAFE.sub(" ", f"{REASON_PREFIX} {result.name}: {message}").split())
    limit = REASON_CHARS - len(more)
    if len(text) > limit:
        text = text[: limit - 3].rstrip() + "..."
    return text + more


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
