"""What `clustercheck node-health --slurm` does to its node in Slurm, decided from `scontrol show node` and the
checks' results. Pure: the command that runs scontrol is clustercheck/run/health.py.

A FAIL drains the node with a reason of ours (`clustercheck: <check>: <message>`); a healthy run resumes it only
when the reason it is drained with is ours, so a node an administrator drained stays drained. A drain of someone
else is never overwritten with ours either: that reason would be lost, and a later healthy run would resume a node
the administrator meant to keep out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from clustercheck.model import CheckResult

REASON_PREFIX = "clustercheck:"
REASON_CHARS = 120  # of the reason we set; sinfo -R shows about 20, scontrol all of it
_FIELD = re.compile(r"(?:^|\s)([A-Za-z_]+)=")
_SIGNED = re.compile(r"\s*\[[^\[\]@]*@[^\[\]]*\]\s*$")  # " [root@2026-11-24T15:01:02]": who set it, and when
_UNSAFE = re.compile(r"[^A-Za-z0-9 _.,:;/+=()<>%@#-]")  # what could break scontrol's parsing or a log line


class ParseError(ValueError):
    """The text is not `scontrol show node` output for the node."""


@dataclass(frozen=True)
class SlurmNode:
    """A node as `scontrol show node NAME` shows it: its name, its state (the base state and its flags, as in
    IDLE+DRAIN) and the reason it was drained or set down, without the `[user@time]` Slurm appends."""

    name: str
    state: tuple[str, ...]
    reason: str | None

    @property
    def drained(self) -> bool:
        """Drained or draining (scontrol shows both as the DRAIN flag: IDLE+DRAIN, MIXED+DRAIN)."""
        return any(flag.startswith("DRAIN") for flag in self.state)

    @property
    def ours(self) -> bool:
        """Drained by clustercheck: the reason is one node-health set."""
        return self.reason is not None and self.reason.startswith(REASON_PREFIX)


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


def parse_show_node(text: str, name: str) -> SlurmNode:
    """The node NAME from `scontrol show node NAME` (one record, or the first of several that is NAME).

    Each line holds `Key=value` fields separated by spaces; a value may itself hold spaces (OS=, Reason=), so a
    field runs to the next ` Key=`, and Reason= (always last on its line) runs to the line's end."""
    records = [r for r in re.split(r"\n\s*\n", text.strip()) if r.strip()]
    for record in records:
        fields = _fields(record)
        if fields.get("NodeName") == name:
            break
    else:
        found = ", ".join(_fields(r).get("NodeName", "?") for r in records) or "no node record"
        raise ParseError(f"no node {name} in scontrol's answer ({found})")
    state = fields.get("State", "")
    if not state:
        raise ParseError(f"no State= for node {name} in scontrol's answer")
    reason = fields.get("Reason")
    if reason is not None:
        reason = _SIGNED.sub("", reason).strip() or None
    return SlurmNode(name, tuple(f for f in state.split("+") if f), reason)


def _fields(record: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    for line in record.splitlines():
        line = line.strip()
        if line.startswith("Reason="):
            fields["Reason"] = line[len("Reason=") :]
            continue
        matches = list(_FIELD.finditer(line))
        for here, after in zip(matches, [*matches[1:], None], strict=True):
            end = after.start() if after is not None else len(line)
            fields.setdefault(here.group(1), line[here.end() : end].strip())
    return fields


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


_VERSION = re.compile(r"^slurm(?:-wlm)?\s+(\d+)\.(\d+)", re.M)


def parse_version(text: str) -> tuple[int, int] | None:
    """(major, minor) from `srun --version` or `slurmd -V` ("slurm 22.05.8", "slurm-wlm 23.11.4"); None if absent."""
    match = _VERSION.search(text)
    return (int(match[1]), int(match[2])) if match else None


def allocation_nodes(hostnames_output: str) -> list[str]:
    """The node names `scontrol show hostnames NODELIST` prints, one per line, in the allocation's order."""
    return [line.strip() for line in hostnames_output.splitlines() if line.strip()]


_GRANTED = re.compile(r"\bGranted job allocation (\d+)\b")


def granted_job(salloc_output: str) -> str | None:
    """The job id `salloc` says it was granted ("salloc: Granted job allocation 42"), or None."""
    match = _GRANTED.search(salloc_output)
    return match[1] if match else None
