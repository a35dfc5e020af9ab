"""Why a node's torchrun failed, in the failing rank's own words (pure logic, no I/O).

torchrun ends a failed job with a report naming the ranks that failed (`rank : 3 (local_rank: 1)`, `exitcode`),
and, unless the script uses torch's @record, "To enable traceback see: ..." where the error should be; its "Root
Cause (first observed failure)" is often a peer that failed because of another rank. The rank's own traceback is
above the report: with --tee every line a rank writes carries `[ROLE LOCAL_RANK]:` (`[default1]:`), and, once
torch.distributed is initialised, torch adds `[rankN]: ` to an uncaught exception's lines. `node_failure` reads a
node's whole torchrun output and returns the rank to blame with the last lines of its traceback, or the exit code
or signal that ended it with the last lines it wrote (an argparse error, a C++ abort's message). The torch-job
runner quotes it; it serves any torchrun output with --tee (the launcher's too).

`rank_ends` reads how each rank of a node ended, for what the launcher says of a whole job: `same_status`, the
exit status every rank failed with alike (the script's own, not torchrun's 1), and `known_cause`, what is known of
a rank's last words.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from clustercheck.facts.model import NodeFacts

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
SIGTERM = 15  # what torchrun (and clustercheck) stop the ranks still running with when one has failed
# A rank's last words that say where its failure comes from, and what is known of it: (pattern, cause, whether it
# happens as the process exits, after its work).
KNOWN_LAST_WORDS = (
    (
        re.compile(r"^terminate called without an active exception$"),
        "C++'s std::terminate with no exception in flight, as when a thread still running is destroyed while the "
        "process exits: with gloo, torch 2.13 has been seen to end a rank so as Python shuts down, after its work "
        "(the README's train_ddp.py leaves with os._exit(0) after destroy_process_group() for it)",
        True,
    ),
)
# A rank's error (its last line) that says it asked for CUDA, or for NCCL, which needs it: "Torch not compiled with
# CUDA enabled", "No CUDA GPUs are available", "Found no NVIDIA driver", "ProcessGroupNCCL is only supported with
# GPUs", and a CPU build's missing torch._C._cuda_* functions.
USES_CUDA = re.compile(r"_cuda|CUDA|NVIDIA driver|NCCL")


@dataclass(frozen=True)
class RankFailure:
    """The rank of a node's torchrun that failed on its own account (or, failing that, the first one that failed)."""

    rank: int | None  # the global rank, when torchrun's report names it
    local_rank: int
    lines: tuple[str, ...]  # the last lines of its traceback, or how it ended and the last lines it wrote
    own: bool  # its own error or a fatal signal, not the loss of a peer (or torchrun stopping it)
    said: tuple[str, ...] = ()  # the last lines it wrote itself (none when it wrote nothing)
    signal: int | None = None  # the signal that ended it

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


def _last_said(lines: list[tuple[int, str]]) -> tuple[str, ...]:
    """The last few lines a rank wrote (blank ones left out)."""
    said = [line.strip() for _, line in lines if line.strip()]
    return tuple(said[-QUOTED_LINES:])


def _exitcode(entry: dict[str, str]) -> int | None:
    """The exit code torchrun's report gives a rank: N, or -N for signal N (None: not a number)."""
    try:
        return int(entry.get("exitcode", "").split(" ")[0])
    except ValueError:
        return None


def node_failure(output: str) -> RankFailure | None:
    """The rank to blame in a node's torchrun OUTPUT (stdout and stderr, --tee on), or None when the output names
    no failed rank (torchrun itself failed: no python, no torch). A rank with an error of its own comes first (its
    traceback, then a fatal signal, then an exit code with the lines it wrote last, as argparse's error), then a
    rank that lost a peer, then one torchrun stopped (SIGTERM), then the report's first entry; among equals, the
    first to write its traceback."""
    ranks = _rank_lines(output)
    report = _report(output)
    end = len(output.splitlines())
    found: list[tuple[int, int, RankFailure]] = []  # (preference, where its account begins, failure)
    for local in sorted(set(ranks) | set(report)):
        entry = report.get(local, {})
        rank = int(entry["rank"]) if "rank" in entry else None
        written = ranks.get(local, [])
        said = _last_said(written)
        traceback = _traceback_tail(written)
        signal = SIGNAL.search(entry.get("traceback", ""))
        code = entry.get("exitcode", "").split(" ")[0]
        if traceback is not None:
            begins, tail = traceback
            own = not PEER_LOSS.search(tail[-1])
            found.append((0 if own else 3, begins, RankFailure(rank, local, tuple(tail), own, said)))
        elif signal or code.startswith("-"):
            name = signal.group(1) if signal else None
            how = signal.group(0) if signal else f"signal {code[1:]}"
            number = -(_exitcode(entry) or 0) or None
            own = name != "SIGTERM"
            failure = RankFailure(rank, local, (f"killed by {how}", *said), own, said, number)
            found.append((1 if own else 4, end, failure))
        elif entry:
            own = bool(said) and not PEER_LOSS.search(said[-1])
            found.append(
                (2 if own else 5, end, RankFailure(rank, local, (f"exit code {code or '?'}", *said), own, said))
            )
    if not found:
        return None
    return min(found, key=lambda f: (f[0], f[1]))[2]


@dataclass(frozen=True)
class RankEnd:
    """How one rank of a node's torchrun ended, as its output tells."""

    local_rank: int
    rank: int | None  # the global rank, when torchrun's report names it
    exitcode: int | None  # torchrun's report: N, or -N for signal N; None: not in the report (it exited 0)
    said: tuple[str, ...]  # the last lines it wrote

    @property
    def failed(self) -> bool:
        """It failed on its own account: an exit code, or a signal other than the SIGTERM it was stopped with."""
        return self.exitcode is not None and self.exitcode != 0 and self.exitcode != -SIGTERM

    @property
    def stopped(self) -> bool:
        return self.exitcode == -SIGTERM


def rank_ends(output: str) -> dict[int, RankEnd]:
    """Local rank -> how it ended, for every rank a node's torchrun OUTPUT (--tee on) shows."""
    ranks = _rank_lines(output)
    report = _report(output)
    out = {}
    for local in sorted(set(ranks) | set(report)):
        entry = report.get(local, {})
        rank = int(entry["rank"]) if "rank" in entry else None
        out[local] = RankEnd(local, rank, _exitcode(entry) if entry else None, _last_said(ranks.get(local, [])))
    return out


def same_status(ends: dict[str, dict[int, RankEnd]], ranks: dict[str, int]) -> int | None:
    """The exit status every rank of a job failed with alike, as a shell gives it (N, or 128+N for signal N), or
    None when they did not. ENDS: node -> its ranks' ends (rank_ends); RANKS: node -> how many ranks it ran. Alike:
    every rank failed on its own with one exit code, or was stopped (by torchrun, or with its node) after writing
    the same last line as one that failed so (every rank gave argparse's error, one exited 2 first and torchrun
    stopped the others as they exited)."""
    failed = [end for node in ends.values() for end in node.values() if end.failed]
    codes = {end.exitcode for end in failed}
    if len(codes) != 1:
        return None
    (code,) = codes
    assert code is not None
    last = {end.said[-1] for end in failed if end.said}
    for node, count in ranks.items():
        for local in range(count):
            end = ends.get(node, {}).get(local)
            if end is None:
                return None
            if end.exitcode != code and (end.failed or not end.said or end.said[-1] not in last):
                return None
    return code if code > 0 else 128 - code


def known_cause(failure: RankFailure) -> tuple[str, bool] | None:
    """What is known of a failed rank's last words: (the cause, whether it happens as the process exits, after its
    work), or None."""
    for pattern, cause, at_exit in KNOWN_LAST_WORDS:
        if any(pattern.search(line) for line in failure.said):
            return cause, at_exit
    return None


def without_cuda(failure: RankFailure, node: str, facts: NodeFacts) -> str | None:
    """What NODE lacks when a rank there failed asking for CUDA (or NCCL): no GPU torch can use, a CPU build of
    torch (FACTS, as clustercheck collected them there), or None when it has them or the error is not about CUDA."""
    torch = facts.torch
    if torch is None or torch.cuda_available or not USES_CUDA.search(failure.lines[-1]):
        return None
    present = facts.gpus_present
    if torch.cuda is None:
        gpus = f"has {present} GPU(s), but" if present else "has no GPU, and"
        return f"{node} {gpus} its torch {torch.version} is a CPU build: the script asks for CUDA"
    return (
        f"torch {torch.version} (CUDA {torch.cuda}) sees no GPU on {node}"
        + (" (nvidia-smi found none)" if not present else f" (nvidia-smi found {present})")
        + ": the script asks for CUDA"
    )
