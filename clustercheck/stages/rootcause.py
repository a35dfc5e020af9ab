"""Why a node's torchrun failed, in the failing rank's own words (pure logic, no I/O).

torchrun ends a failed job with a report naming the ranks that failed (`rank : 3 (local_rank: 1)`, `exitcode`),
and, unless the script uses torch's @record, "To enable traceback see: ..." where the error should be; its "Root
Cause (first observed failure)" is often a peer that failed because of another rank. The rank's own traceback is
above the report: with --tee every line a rank writes carries `[ROLE LOCAL_RANK]:` (`[default1]:`), and, once
torch.distributed is initialised, torch adds `[rankN]: ` to an uncaught exception's lines. `node_failure` reads a
node's whole torchrun output and returns the rank to blame with the last lines of its traceback, or the signal
that killed it. The torch-job runner quotes it; it serves any torchrun output with --tee (the launcher's too).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

TEE_MARK = re.compile(r"^\[[A-Za-z_][\w.-]*?(\d+)\]:")  # torchrun --tee: [ROLE LOCAL_RANK]:
TORCH_RANK_MARK = re.compile(r"^\[rank\d+\]: ?")  # torch.distributed's prefix on an uncaught exception's lines
REPORT_FIELD = re.compile(r"^\s+(rank|exitcode|traceback)\s*:\s*(.*?)\s*$")
REPORT_RANK = re.compile(r"(\d+) \(local_rank: (\d+)\)")
SIGNAL = re.compile(r"Signal \d+ \((SIG[A-Z]+)\)")
# A rank that failed because a peer went away: its error follows from another rank's.
PEER_LOSS = re.compile(
    r"closed by peer|reset by peer|Broken pipe|remote worker|remote process|timed out|Timeout|aborted|"
    r"DistNetworkError|DistBackendError",
    re.IGNORECASE,
)
QUOTED_LINES = 3


@dataclass(frozen=True)
class RankFailure:
    """The rank of a node's torchrun that failed on its own account (or, failing that, the first one that failed)."""

    rank: int | None  # the global rank, when torchrun's report names it
    local_rank: int
    lines: tuple[str, ...]  # the last lines of its traceback, or what killed it
    own: bool  # its own error or a fatal signal, not the loss of a peer (or torchrun stopping it)

    def text(self) -> str:
        who = (
            f"rank {self.rank} (local rank {self.local_rank})"
            if self.rank is not None
            else f"local rank {self.local_rank}"
        )
        return f"{who}: " + " | ".join(self.lines)


def _rank_lines(output: str) -> dict[int, list[tuple[int, str]]]:
    """Local rank -> the lines it wrote (with their line number in OUTPUT), marks taken off, in order."""
    lines: dict[int, list[tuple[int, str]]] = {}
    for number, line in enumerate(output.splitlines()):
        mark = TEE_MARK.match(line)
        if mark:
            text = TORCH_RANK_MARK.sub("", line[mark.end() :])
            lines.setdefault(int(mark.group(1)), []).append((number, text.rstrip()))
    return lines


def _report(output: str) -> dict[int, dict[str, str]]:
    """Local rank -> its entry in torchrun's failure report: global rank, exit code, traceback field."""
    entries: dict[int, dict[str, str]] = {}
    current: dict[str, str] = {}
    for line in output.splitlines():
        field = REPORT_FIELD.match(line)
        if not field:
            continue
        if field.group(1) == "rank":
            numbers = REPORT_RANK.search(field.group(2))
            current = {}
            if numbers:
                current["rank"] = numbers.group(1)
                entries.setdefault(int(numbers.group(2)), current)
        else:
            current[field.group(1)] = field.group(2)
    return entries


def _traceback_tail(lines: list[tuple[int, str]]) -> tuple[int, list[str]] | None:
    """Where the last traceback in a rank's LINES begins, and its last lines: its last frame and the exception."""
    starts = [i for i, (_, line) in enumerate(lines) if line.strip() == "Traceback (most recent call last):"]
    if not starts:
        return None
    block = [line.strip() for _, line in lines[starts[-1] + 1 :] if line.strip(" ^~")]
    return (lines[starts[-1]][0], block[-QUOTED_LINES:]) if block else None


def node_failure(output: str) -> RankFailure | None:
    """The rank to blame in a node's torchrun OUTPUT (stdout and stderr, --tee on), or None when the output names
    no failed rank (torchrun itself failed: no python, no torch). A rank with an error of its own comes first, then
    one killed by a signal (not torchrun's SIGTERM to the ranks it stops), then a rank that lost a peer, then the
    report's first entry; among equals, the first to write its traceback."""
    ranks = _rank_lines(output)
    report = _report(output)
    end = len(output.splitlines())
    found: list[tuple[int, int, RankFailure]] = []  # (preference, where its account begins, failure)
    for local in sorted(set(ranks) | set(report)):
        entry = report.get(local, {})
        rank = int(entry["rank"]) if "rank" in entry else None
        traceback = _traceback_tail(ranks.get(local, []))
        signal = SIGNAL.search(entry.get("traceback", ""))
        code = entry.get("exitcode", "").split(" ")[0]
        if traceback is not None:
            begins, tail = traceback
            own = not PEER_LOSS.search(tail[-1])
            found.append((0 if own else 2, begins, RankFailure(rank, local, tuple(tail), own)))
        elif signal or code.startswith("-"):
            name = signal.group(1) if signal else None
            how = signal.group(0) if signal else f"signal {code[1:]}"
            own = name != "SIGTERM"
            found.append((1 if own else 3, end, RankFailure(rank, local, (f"killed by {how}",), own)))
        elif entry:
            found.append((4, end, RankFailure(rank, local, (f"exit code {code or '?'}",), False)))
    if not found:
        return None
    return min(found, key=lambda f: (f[0], f[1]))[2]
