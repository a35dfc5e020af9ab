"""The launch's preflight: the pipeline with only the core and network stages (no torch job before the user's
own); any FAIL or ERROR refuses the launch with each check's own fix. With spares (launch --spare), vet: a node
with a problem of its own is left out instead (spares.py)."""

from __future__ import annotations

import time
from pathlib import Path

from clustercheck.config import NodeOptions, RunConfig, shared
from clustercheck.facts.model import NodeFacts
from clustercheck.inventory import Node
from clustercheck.launcher import spares
from clustercheck.launcher.job import Echo, HostKeysRefused, LaunchOptions, NotStarted
from clustercheck.model import CheckResult, Status
from clustercheck.reach import Reach
from clustercheck.report import delivery
from clustercheck.run.pipeline import Outcome, Pipeline
from clustercheck.selection import Selection

PREFLIGHT = Selection(only=("core", "network"), skip=("local.*",))  # quick: no torch job before the user's own


def run(nodes: list[Node], options: LaunchOptions, reach: Reach, say: Echo) -> dict[str, NodeFacts]:
    """The preflight on NODES; returns the facts it collected (not collected again). Raises NotStarted."""
    outcome, written = _checks(nodes, options, reach, say)
    _refuse([r for r in outcome.results if r.status.is_problem], written, say)
    _passed(outcome.results, say)
    return outcome.facts


def vet(
    nodes: list[Node], options: LaunchOptions, reach: Reach, say: Echo, wanted: int
) -> tuple[dict[str, NodeFacts], spares.Choice, list[CheckResult]]:
    """The preflight on NODES (the job's WANTED and its spares, launch --spare): the facts it collected, the nodes
    the job runs on (spares.choose, each node left out said in one line) and the results. A problem that names no
    single node refuses the launch as run() does (NotStarted); so does a host key refused."""
    outcome, written = _checks(nodes, options, reach, say)
    order = [n.name for n in nodes]
    _refuse(spares.unplaced(outcome.results, order), written, say)
    choice = spares.choose(outcome.results, order, wanted)
    if not choice.enough:
        for left in choice.failing:
            say(f"  {left.line()}")
        return outcome.facts, choice, outcome.results
    say(f"preflight: the job runs on {len(choice.kept)} of the {len(order)} nodes: {', '.join(choice.kept)}")
    for left in choice.left_out:
        say(f"  {left.line()}")
    _passed([r for r in outcome.results if r.host in choice.kept or not r.host], say)
    return outcome.facts, choice, outcome.results


def _checks(nodes: list[Node], options: LaunchOptions, reach: Reach, say: Echo) -> tuple[Outcome, Path]:
    """The core and network stages on NODES, their report saved in the run directory (its path returned)."""
    o = options
    config = RunConfig(
        **shared(o, NodeOptions),
        run_dir=o.run_dir / "preflight",
        selection=PREFLIGHT,
        master_port=o.master_port,
        ssh=o.ssh,
        inventory=o.inventory,
    )
    say(f"preflight: core and network checks on {len(nodes)} node(s)")
    started = time.time()
    pipeline = Pipeline(nodes, config, reach)
    outcome = pipeline.run()
    document = delivery.build(outcome.results, [n.name for n in nodes], pipeline.run_id, started)
    delivery.save(document, o.run_dir / "preflight", kinds=("json",))  # made here: no node may have answered
    if outcome.host_key_error:
        raise HostKeysRefused(first_problem(outcome.results) or "host key verification failed")
    return outcome, o.run_dir / "preflight" / delivery.RUN_FILES["json"]


def _refuse(problems: list[CheckResult], written: Path, say: Echo) -> None:
    """NotStarted when there are PROBLEMS, each said with its check's own fix: skipping the preflight would only start
    a job that fails the same way."""
    if not problems:
        return
    for r in problems:
        fix = f"; fix: {r.remediation}" if r.remediation else ""
        say(f"  {r.status.value} {r.name}{' on ' + r.host if r.host else ''}: {r.message}{fix}")
    fix = f"; fix: {problems[0].remediation}" if problems[0].remediation else ""
    raise NotStarted(
        f"preflight failed ({len(problems)} check(s)), nothing was started: {first_problem(problems)}{fix} "
        f"(report: {written})"
    )


def _passed(results: list[CheckResult], say: Echo) -> None:
    warned = sum(1 for r in results if r.status is Status.WARN)
    say(f"preflight passed ({len(results)} checks, {warned} warning(s))")


def first_problem(results: list[CheckResult]) -> str | None:
    for r in results:
        if r.status.is_problem:
            return f"{r.name}{' on ' + r.host if r.host else ''}: {r.message}"
    return None
