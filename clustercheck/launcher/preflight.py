"""The launch's preflight: the pipeline with only the core and network stages (no torch job before the user's
own); any FAIL or ERROR refuses the launch with each check's own fix."""

from __future__ import annotations

import time

from clustercheck.config import RunConfig
from clustercheck.facts.model import NodeFacts
from clustercheck.inventory import Node
from clustercheck.launcher.job import Echo, HostKeysRefused, LaunchOptions, NotStarted
from clustercheck.model import CheckResult, Status
from clustercheck.reach import Reach
from clustercheck.report import delivery
from clustercheck.run.pipeline import Pipeline
from clustercheck.selection import Selection

PREFLIGHT = Selection(only=("core", "network"), skip=("local.*",))  # quick: no torch job before the user's own


def run(nodes: list[Node], options: LaunchOptions, reach: Reach, say: Echo) -> dict[str, NodeFacts]:
    """The preflight on NODES; returns the facts it collected (not collected again). Raises NotStarted."""
    o = options
    config = RunConfig(
        run_dir=o.run_dir / "preflight",
        selection=PREFLIGHT,
        python=o.python,
        container=o.container,
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
    written = o.run_dir / "preflight" / delivery.RUN_FILES["json"]
    if outcome.host_key_error:
        raise HostKeysRefused(first_problem(outcome.results) or "host key verification failed")
    problems = [r for r in outcome.results if r.status.is_problem]
    if problems:
        # Each check's own fix: skipping the preflight would only start a job that fails the same way.
        for r in problems:
            fix = f"; fix: {r.remediation}" if r.remediation else ""
            say(f"  {r.status.value} {r.name}{' on ' + r.host if r.host else ''}: {r.message}{fix}")
        fix = f"; fix: {problems[0].remediation}" if problems[0].remediation else ""
        raise NotStarted(
            f"preflight failed ({len(problems)} check(s)), nothing was started: {first_problem(problems)}{fix} "
            f"(report: {written})"
        )
    warned = sum(1 for r in outcome.results if r.status is Status.WARN)
    say(f"preflight passed ({len(outcome.results)} checks, {warned} warning(s))")
    return outcome.facts


def first_problem(results: list[CheckResult]) -> str | None:
    for r in results:
        if r.status.is_problem:
            return f"{r.name}{' on ' + r.host if r.host else ''}: {r.message}"
    return None
