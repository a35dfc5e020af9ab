"""Reports: one module per output format, each `render(report) -> str`, chosen by `--format`.

Adding a format means adding a module with a `render` function and listing it in FORMAT_NAMES and
`_formats`; the CLI's `--format` choices come from here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from clustercheck.model import CheckResult, Status, overall_status

SCHEMA_VERSION = 1
CLUSTER_SUITE = "(cluster)"  # where a cluster-wide check (host None) is listed


@dataclass(frozen=True)
class Report:
    """What one `clustercheck run` found, as every format renders it."""

    results: list[CheckResult]
    hosts: list[str]
    run_id: str | None = None  # CLUSTERCHECK_RUN=<run_id> marks this run's processes on the nodes
    started_at: float | None = None  # Unix time the run started
    duration_s: float | None = None
    extra: dict = field(default_factory=dict)
    durations: dict[str, float] = field(default_factory=dict)  # stage -> seconds it ran (the stages that ran)
    hosts_args: tuple[str, ...] = ()  # the arguments that chose the hosts (--hosts, --limit), for the next command

    @property
    def status(self) -> Status:
        return overall_status(self.results)

    @property
    def stages(self) -> list[StageSummary]:
        return stage_summaries(self.results, self.durations)

    @property
    def verdict(self) -> str:
        return verdict(self)

    @property
    def next_step(self) -> str:
        return next_step(self)


@dataclass(frozen=True)
class StageSummary:
    """One stage of a run: how it went, how long it took, or why it did not run."""

    name: str
    status: Status  # the worst of its results (PASS, WARN or FAIL); SKIP when every one of them is SKIP
    duration_s: float | None  # None: it did not run (or the report does not know)
    skipped: str | None = None  # why it did not run, when none of its checks judged anything
    deselected_by: tuple[str, ...] = ()  # then, the options that left its checks out (`--only core`), if options did

    @property
    def verified(self) -> bool:
        return self.status is not Status.SKIP


# A run proves a cluster ready for multi-node PyTorch only when these stages judged it: the network between the
# nodes, collectives across them and DDP across them. The others (data, lightning) are proofs of their own.
READY_NEEDS = ("network", "collectives", "ddp")
SEVERITY = {Status.ERROR: 0, Status.FAIL: 1, Status.WARN: 2, Status.PASS: 3, Status.SKIP: 4}  # worst first


def duration_text(seconds: float) -> str:
    """12.3 s, or 1m15s from a minute on."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes}m{secs:02d}s"


def stage_summaries(results: list[CheckResult], durations: dict[str, float] | None = None) -> list[StageSummary]:
    """Every stage, in the order they run, from its checks' results (each carries its stage) and the seconds each
    stage ran; a stage none of whose checks judged anything says why, from its results' skip reasons."""
    from clustercheck.selection import STAGES

    durations = durations or {}
    by_stage: dict[str, list[CheckResult]] = {stage: [] for stage in STAGES}
    for r in results:
        if r.stage in by_stage:
            by_stage[r.stage].append(r)
    summaries = []
    for stage, members in by_stage.items():
        judged = [r for r in members if r.status is not Status.SKIP]
        if not members and stage not in durations:
            continue  # nothing of this stage in the report (a report of some checks only)
        skipped, deselected_by = None, ()
        if not judged:
            skips = [r.skip for r in members if r.skip is not None]
            reasons = list(dict.fromkeys(s.reason for s in skips))
            skipped = "; ".join(reasons) if reasons else "nothing to check"
            deselected_by = tuple(dict.fromkeys(s.deselected_by for s in skips if s.deselected_by))
        status = overall_status(judged) if judged else Status.SKIP
        summaries.append(StageSummary(stage, status, durations.get(stage), skipped, deselected_by))
    return summaries


def unverified(stages: list[StageSummary]) -> list[StageSummary | str]:
    """The stages READY needs that did not judge the cluster (a name where the report has nothing of the stage)."""
    known = {s.name: s for s in stages}
    return [known.get(n, n) for n in READY_NEEDS if n not in known or not known[n].verified]


def _names(stages: list[StageSummary | str]) -> str:
    return ", ".join(s if isinstance(s, str) else s.name for s in stages)


def verdict(report: Report) -> str:
    """One line: NOT READY with the failures; NOT VERIFIED as asked when an option's work was done on no node
    (--burn on nodes without GPUs), naming it; READY for multi-node PyTorch when the multi-node stages proved it
    across more than one node, and on one node what they proved there (multi-node is not proven by one node);
    else what passed and what was not verified."""
    results = report.results
    status = overall_status(results)
    if status is Status.FAIL:
        bad = sum(1 for r in results if r.status.is_problem)
        return f"NOT READY: {bad} check(s) failed"
    warnings = " (with warnings)" if status is Status.WARN else ""
    undone = [line for r in results if r.name == "options.done" for line in r.data.get("undone") or ()]
    if undone:  # asked for, done nowhere: not a READY that reads as if it had been done (checks/requests.py)
        return f"NOT VERIFIED as asked: {'; '.join(undone)} (otherwise: {_verdict(report, results, warnings)})"
    return _verdict(report, results, warnings)


def _verdict(report: Report, results: list[CheckResult], warnings: str) -> str:
    stages = report.stages
    missing = unverified(stages)
    if not missing and len(report.hosts) > 1:
        return "READY for multi-node PyTorch" + warnings
    if not missing:
        node = report.hosts[0] if report.hosts else "this node"
        ranks = next((r.data["world_size"] for r in results if r.stage == "ddp" and "world_size" in r.data), None)
        with_ranks = f" with {ranks} rank{'s' if ranks != 1 else ''}" if ranks else ""
        return f"READY for PyTorch on {node}{with_ranks}{warnings}; multi-node not verified with one node"
    passed = ", ".join(s.name for s in stages if s.verified) or "nothing"
    why = "; ".join(dict.fromkeys("no result" if isinstance(s, str) else s.skipped or "" for s in missing))
    return f"NOT VERIFIED for multi-node PyTorch: {passed} passed{warnings}; {_names(missing)} did not run ({why})"


def next_step(report: Report) -> str:
    """What to do next, in one line: the first failure to fix, the stages still to run, or the training to start."""
    import shlex

    problems = in_run_order([r for r in report.results if r.status.is_problem])
    if problems:
        first = problems[0]
        where = f" on {first.host}" if first.host else ""
        others = f", then the {len(problems) - 1} other failure(s)" if len(problems) > 1 else ""
        return f"fix {first.name}{where} first{others} (each with its fix above), and run the same command again"
    missing = unverified(report.stages)
    if missing:
        flags = list(dict.fromkeys(f for s in missing if not isinstance(s, str) for f in s.deselected_by))
        if flags:
            return f"run the same command without {' and '.join(flags)} to verify {_names(missing)}"
        return f"find out why {_names(missing)} did not run (above), and run the same command again"
    hosts = shlex.join(report.hosts_args) if report.hosts_args else "--hosts INVENTORY"
    read = "read the warnings above, then " if report.status is Status.WARN else ""
    return f"{read}train: clustercheck launch {hosts} -- train.py ARGS (your script under torchrun on every node)"


def in_run_order(results: list[CheckResult]) -> list[CheckResult]:
    """RESULTS in the order a run meets their checks: the stages' order, then the catalog's within a stage
    (connect first), each check's hosts in the order given. A report lists the results node by node, so its first
    problem can be a late check on a node that was reached (hostname.resolve, judged for a cluster of several)
    ahead of the node that could not be reached at all, which is what keeps the multi-node stages from running."""
    from clustercheck.checks import REGISTRY
    from clustercheck.selection import STAGES

    stages = {name: i for i, name in enumerate(STAGES)}
    checks = {name: i for i, name in enumerate(REGISTRY)}
    return sorted(results, key=lambda r: (stages.get(r.stage or "", len(stages)), checks.get(r.name, len(checks))))


def _formats() -> dict[str, Callable[[Report], str]]:
    from clustercheck.report import json, junit, markdown, prometheus, text

    return {
        "text": text.render,
        "json": json.render,
        "junit": junit.render,
        "markdown": markdown.render,
        "prometheus": prometheus.render,
    }


FORMAT_NAMES = ("text", "json", "junit", "markdown", "prometheus")


def render(report: Report, fmt: str) -> str:
    return _formats()[fmt](report)


def schema_text() -> str:
    """The JSON Schema of the JSON report (shipped in the package; `clustercheck schema` prints it)."""
    from importlib.resources import files

    return files(__package__).joinpath("report.schema.json").read_text()


def write_atomic(path, content: str | Callable[[Any], None]) -> None:
    """Write CONTENT to PATH through a temporary file in the same directory and a rename, so a reader (a
    monitoring agent, a CI step) never sees half a report. CONTENT: the text, or a function that writes it to the
    open file (a report written as it is rendered)."""
    import os
    import tempfile
    from pathlib import Path

    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent or ".")
    try:
        with os.fdopen(fd, "w") as fh:
            if callable(content):
                content(fh)
            else:
                fh.write(content)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
