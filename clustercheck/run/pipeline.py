"""Drive a run: the core stage on every node in parallel, the consistency checks, then the multi-node stages in
order; every node cleaned up at the end, on Ctrl-C, and on any error.

Hosts run in parallel under a cap (--forks); each host's steps are bounded by the connect timeouts and
per-command deadlines, so a hung or dead host never holds back the others' results beyond its timeouts. The nodes
are reached through a Reach (reach.py), so all of this is tested with fake transports.

The rooms of a run, each a module of run/: hosts.py (the core stage on one host), record.py (what the hosts leave
for the rest of the run), multinode.py (the multi-node stages in order, the torch job), nodelocal.py (local.* where
the torch job took them over), results.py (the results as the report gives them), abort.py (stopping, cleaning up).
This module runs them in order.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from clustercheck.checks import registry
from clustercheck.config import RunConfig
from clustercheck.facts.model import NodeFacts
from clustercheck.inventory import Node
from clustercheck.model import CheckResult
from clustercheck.reach import Reach
from clustercheck.run import results as report
from clustercheck.run.abort import Abort, Interrupted
from clustercheck.run.hosts import HostRun
from clustercheck.run.multinode import run_stages
from clustercheck.run.nodelocal import node_local
from clustercheck.run.record import RunRecord
from clustercheck.selection import DISTRIBUTED
from clustercheck.stages import Context, Progress
from clustercheck.transport import new_run_id


@dataclass
class Outcome:
    results: list[CheckResult]
    host_key_error: bool = False
    unclean: dict[str, str] = field(default_factory=dict)  # node -> why what the run started there was not stopped
    facts: dict[str, NodeFacts] = field(default_factory=dict)  # node -> its facts, for every node collected
    durations: dict[str, float] = field(default_factory=dict)  # stage -> seconds it ran, for the stages that ran


class Pipeline:
    def __init__(
        self,
        nodes: list[Node],
        config: RunConfig,
        reach: Reach,
        progress: Progress | None = None,
        run_id: str | None = None,
    ) -> None:
        self.nodes = nodes
        self.config = config
        self.reach = reach
        self.progress = progress or (lambda host, stage: None)
        self.run_id = run_id or new_run_id()
        self.ctx = Context(config, self.progress, tuple(n.name for n in nodes), reach)
        self.record = RunRecord()
        self.stopping = Abort(self.progress)
        self.later = any(config.selection.stage_selected(s) for s in DISTRIBUTED)  # a multi-node stage follows
        self.hosts = HostRun(self.ctx, reach, self.run_id, self.record, self.stopping, self.later)

    def run(self) -> Outcome:
        try:
            started = time.monotonic()
            self.reach.each(self.hosts, self.nodes, limit=self.config.forks, name=lambda n: n.name)
            selection = self.config.selection
            cluster = [report.distinct(self.nodes, selection, self.record)]
            cluster += registry.run_cluster_checks(self.record.reached(self.nodes), self.config, selection)
            durations = {"core": time.monotonic() - started}
            ran = run_stages(self.nodes, self.record, self.ctx, self.stopping, self.later)
            durations.update(ran.durations)
            local = node_local(self.nodes, self.record, ran, self.reach, self.stopping)
            results = []
            for node in self.nodes:  # ssh.session last: what the node's sshd did through the whole run
                results += self.record.results.get(node.name, []) + local.get(node.name, [])
                results += self.hosts.session(node)
            results += cluster + ran.results
            compared, timed = report.compared(self.config, self.ctx.hosts, results)
            durations.update(timed)
            results = report.finished(results + compared, self.record.facts, self.config)
        except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: kill what we started everywhere, then say where not
            raise Interrupted(self.abort()) from exc
        except BaseException:  # a bug: kill what we started everywhere, then let it propagate
            self.abort()
            raise
        for node in self.nodes:
            self.progress(node.name, "cleaning up")
        unclean = self.abort()  # the transports stay open for the multi-node stages; now every node is cleaned up
        for node in self.nodes:
            self.progress(node.name, "done")
        return Outcome(results, self.record.host_key_error, unclean, dict(self.record.facts), durations)

    def abort(self) -> dict[str, str]:
        """Stop every host: kill this run's processes on every node (in parallel, bounded), then disconnect.
        Returns the nodes that could not be cleaned up: node -> why."""
        return self.stopping.stop(self.reach, self.record)
