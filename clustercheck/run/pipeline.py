"""Drive a run: the core stage on every node in parallel, the consistency checks, then the multi-node stages in
order; every node cleaned up at the end, on Ctrl-C, and on any error.

Hosts run in parallel under a cap (--forks); each host's steps are bounded by the connect timeouts and
per-command deadlines, so a hung or dead host never holds back the others' results beyond its timeouts. The nodes
are reached through a Reach (reach.py), so all of this is tested with fake transports.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from clustercheck.checks import baseline, connection, registry, setup_roles, torchinstall
from clustercheck.config import RunConfig
from clustercheck.facts import parse
from clustercheck.facts.model import NodeFacts
from clustercheck.inventory import Node
from clustercheck.model import CheckResult, Skip, Status
from clustercheck.reach import Reach
from clustercheck.selection import DISTRIBUTED
from clustercheck.selection import stage as declared
from clustercheck.stages import Context, Member, core, modules, shared
from clustercheck.transport import HostKeyError, Transport, TransportError, new_run_id

Progress = Callable[[str, str], None]


@dataclass
class Outcome:
    results: list[CheckResult]
    host_key_error: bool = False
    unclean: dict[str, str] = field(default_factory=dict)  # node -> why what the run started there was not stopped
    facts: dict[str, NodeFacts] = field(default_factory=dict)  # node -> its facts, for every node collected
    durations: dict[str, float] = field(default_factory=dict)  # stage -> seconds it ran, for the stages that ran


class Interrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM, after every node was cleaned up: UNCLEAN names the nodes that could not be, and why."""

    def __init__(self, unclean: dict[str, str]) -> None:
        super().__init__()
        self.unclean = unclean


CLEANUP_WAIT = 30.0  # seconds the cleanup of all nodes may take together


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
        self._abort = threading.Event()
        self._lock = threading.Lock()
        self._transports: dict[str, Transport] = {}
        self._results: dict[str, list[CheckResult]] = {}
        self._facts: dict[str, NodeFacts] = {}
        self._host_key_error = False
        self._durations: dict[str, float] = {}
        self._identities: dict[str, parse.Identity | None] = {}  # node -> the identity its first command read
        self._machines: dict[tuple[str, str, str], str] = {}  # identity key -> the node checked as that machine
        self._same: dict[str, str] = {}  # node -> the node checked in its place (the same machine)
        self._shells: dict[str, str | None] = {}  # node -> its login shell, as its first command read it
        self._later = any(config.selection.stage_selected(s) for s in DISTRIBUTED)  # a multi-node stage follows
        self._members: list[Member] = []  # the nodes of the multi-node stages, once they were found
        self._torch_job: shared.SharedJob | None = None  # the run's torch job, once planned

    # ------------------------------------------------------------------ the whole run

    def run(self) -> Outcome:
        try:
            started = time.monotonic()
            self.reach.each(self._host, self.nodes, limit=self.config.forks, name=lambda n: n.name)
            cluster = [self._distinct()]
            reached = [self._facts[n.name] for n in self.nodes if n.name in self._facts]
            selection = self.config.selection
            cluster += registry.run_cluster_checks(reached, self.config, selection)
            self._durations["core"] = time.monotonic() - started
            later = self._multinode()
            self._local_collectives()
            results = []
            for node in self.nodes:  # ssh.session last: what the node's sshd did through the whole run
                results += self._results.get(node.name, []) + self._session(node)
            results += cluster + later
            results += self._baseline(results)
            torches = {name: facts.torch.version if facts.torch else None for name, facts in self._facts.items()}
            results = torchinstall.with_pinned_torch(results, torches)
            results = setup_roles.with_fix_commands(results, self.config.inventory)
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
        return Outcome(results, self._host_key_error, unclean, dict(self._facts), dict(self._durations))

    def abort(self) -> dict[str, str]:
        """Stop every host: kill this run's processes on every node (in parallel, bounded), then disconnect.
        Returns the nodes that could not be cleaned up: node -> why."""
        self._abort.set()
        with self._lock:
            transports = list(self._transports.values())
        return self.reach.finish(transports, timeout=CLEANUP_WAIT)

    # ------------------------------------------------------------------ the multi-node stages

    def _multinode(self) -> list[CheckResult]:
        hosts = list(self.ctx.hosts)
        missing = {
            n.name: f"the same machine as {self._same[n.name]} (nodes.distinct)"
            if n.name in self._same
            else "not reached, or its facts were not collected"
            for n in self.nodes
            if n.name not in self._facts or n.name not in self._transports
        }
        members: list[Member] = []
        if not missing:
            members = core.members(self.nodes, self._transports, self._facts)
        blocked = (
            "; ".join(f"{name}: {why}" for name, why in sorted(missing.items()))
            + " (a multi-node job needs every node)"
            if missing
            else None
        )
        self._members = members
        if len(members) == 1 and self._later and not self.config.master_port_given:  # alone: a port of its own
            port = core.local_port(members[0].transport, members[0].facts.python)
            self.config = replace(self.config, master_port=port)
            self.ctx = replace(self.ctx, config=self.config)
        no_torch = [m.name for m in members if m.facts.torch_problem]
        results: list[CheckResult] = []
        ctx = self.ctx
        for stage in DISTRIBUTED:
            module = modules()[stage]
            checks = registry.of_stage(stage)
            why = self._why_not(stage, blocked)
            if not why and declared(stage).needs_torch and no_torch:
                why = f"torch does not import on {', '.join(no_torch)}"
            if why:
                for check in checks:
                    results += registry.skipped(check, hosts, why)
                continue
            if self._abort.is_set():
                raise core.Aborted
            if declared(stage).needs_torch and self._torch_job is None:
                self._torch_job = self._plan_torch_job(stage, members)
                ctx = replace(self.ctx, torch_job=self._torch_job)
            for m in members:
                self.progress(m.name, stage)
            started = time.monotonic()
            stage_results = [self._deselect(r) for r in module.run(members, ctx)]
            self._durations[stage] = time.monotonic() - started
            results += stage_results
            problems = [r for r in stage_results if r.status.is_problem]
            if problems and declared(stage).gates:
                blocked = f"the {stage} stage failed ({problems[0].message})"
                if stage == "network":
                    blocked = f"the network stage failed, so no torch job was started ({problems[0].message})"
        self._torch_durations()
        return results

    def _torch_durations(self) -> None:
        """The torch stages' times from the run's torch job: the first stage that ran it waited for all of it;
        each later stage's time is its own part's on its slowest rank, taken off the first's, which keeps the job's
        start (torchrun, torch's import, the process group), the node-local part and the results' collection."""
        job = self._torch_job
        if job is None:
            return
        ran = [s for s in DISTRIBUTED if s in job.parts and s in self._durations]
        for stage in ran[1:]:
            seconds = job.seconds(stage)
            if seconds is not None:
                self._durations[stage] = seconds
                self._durations[ran[0]] = max(self._durations[ran[0]] - seconds, 0.0)

    def _why_not(self, stage: str, blocked: str | None) -> str | Skip | None:
        """Why multi-node STAGE does not run (None: it runs), as far as the selection and the nodes (BLOCKED: why
        a multi-node job cannot run) decide it."""
        selection = self.config.selection
        checks = registry.of_stage(stage)
        if not selection.stage_selected(stage):
            return selection.why_not_stage(stage)
        if not any(selection.check_selected(c.name) for c in checks):
            return selection.why_not_checks(c.name for c in checks)
        return blocked

    def _plan_torch_job(self, first: str, members: list[Member]) -> shared.SharedJob:
        """The run's torch job, as torch stage FIRST is about to run: the node-local collectives when the core
        stage left them to it, and the part of FIRST and of every torch stage after it that is to run (a stage
        that cannot take part says why when it runs)."""
        selection = self.config.selection
        parts: dict[str, list[str]] = {}
        if shared.defers_local(self.ctx.hosts, selection) and any(
            selection.check_selected(n) for n in core.LOCAL_NAMES
        ):
            parts[shared.LOCAL] = []
        for stage in DISTRIBUTED[DISTRIBUTED.index(first) :]:
            if declared(stage).needs_torch and not self._why_not(stage, None):
                args = modules()[stage].part_args(members, self.ctx)
                if args is not None:
                    parts[stage] = args
        return shared.SharedJob(parts)

    def _local_collectives(self) -> None:
        """local.* on every node whose facts were collected, where the core stage left them to the torch job
        (shared.defers_local): the job's node-local part when it ran one, else each node's own node-local job, all
        nodes at once (the run's multi-node stages did not get as far as the torch job)."""
        if not shared.defers_local(self.ctx.hosts, self.config.selection):
            return
        job = self._torch_job
        members = {m.name: m for m in self._members}
        part = None
        if job is not None and shared.LOCAL in job.parts and job.ran:
            with contextlib.suppress(Exception):  # it did not start: each node runs its own job below
                part = job.outcome(shared.LOCAL, self._members, self.ctx)
        names = [n.name for n in self.nodes if n.name in self._facts and n.name in self._transports]

        def local(name: str) -> list[CheckResult]:
            if part is not None and name in members:
                return [self._deselect(r) for r in shared.local_results(members[name], part)]
            self._step(self._node(name), "collectives on the node")
            return core.local_collectives(self._facts[name], self._transports[name], self.ctx)

        found = self.reach.each(local, names, limit=self.config.forks, name=lambda n: n)
        for i, name in enumerate(names):
            got = found.get(i)
            if isinstance(got, core.Aborted):
                raise got
            if isinstance(got, BaseException):
                got = [
                    registry.get("internal").result(
                        name, registry.Finding(Status.ERROR, f"clustercheck failed: {type(got).__name__}: {got}")
                    )
                ]
            with self._lock:
                self._results.setdefault(name, []).extend(got)

    def _node(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)

    def _baseline(self, results: list[CheckResult]) -> list[CheckResult]:
        """With --baseline: this run's results against the earlier report's (nothing reported without it)."""
        given = self.config.baseline
        if given is None:
            return []
        selection = self.config.selection
        if not selection.stage_selected(baseline.STAGE):
            why = selection.why_not_stage(baseline.STAGE)
            return [
                r
                for check in registry.of_stage(baseline.STAGE)
                for r in registry.skipped(check, list(self.ctx.hosts), why)
            ]
        started = time.monotonic()
        current = {"hosts": list(self.ctx.hosts), "checks": [r.to_dict() for r in results]}
        compared = [self._deselect(r) for r in baseline.evaluate(given, current)]
        self._durations[baseline.STAGE] = time.monotonic() - started
        return compared

    def _deselect(self, result: CheckResult) -> CheckResult:
        selection = self.config.selection
        if selection.check_selected(result.name):
            return result
        return registry.get(result.name).not_run(result.host, selection.why_not_check(result.name))

    # ------------------------------------------------------------------ one host

    def _host(self, node: Node) -> None:
        if self._abort.is_set():
            return
        transport: Transport | None = None
        results: list[CheckResult] = []
        try:
            transport, connect_result = self._connect(node)
            results.append(connect_result)
            begun = self._begin(node, transport) if transport is not None else None
            if begun is None:
                transport = None  # not reached, or another name of a machine checked under its first name
            else:
                assert transport is not None
                outcome = core.run_host(node, transport, self.ctx, lambda stage: self._step(node, stage), begun)
                results += outcome.results
                if outcome.facts is not None:
                    with self._lock:
                        self._facts[node.name] = outcome.facts
        except core.Aborted:
            return
        except Exception as exc:  # a bug in one host's run must not hide the other hosts' results
            results.append(
                registry.get("internal").result(
                    node.name, registry.Finding(Status.ERROR, f"clustercheck failed: {type(exc).__name__}: {exc}")
                )
            )
        finally:
            # The transport stays open for the multi-node stages; run() cleans every node up at the end (and
            # nothing needs stopping before that when no multi-node stage follows).
            if transport is not None and not self._abort.is_set() and self._later:
                with contextlib.suppress(Exception):
                    transport.stop()
        self.progress(node.name, "done")
        with self._lock:
            self._results[node.name] = results

    def _session(self, node: Node) -> list[CheckResult]:
        transport = self._transports.get(node.name)
        if transport is None or node.name not in self._shells:
            return []
        return [core.session(node, transport, self._shells[node.name])]

    def _begin(self, node: Node, transport: Transport) -> core.NodeStart | None:
        """The node's first command (core.start: its identity, python and facts), or None when NODE is a machine
        another inventory name already reached. Nothing more runs under the second name: its transport is closed
        without the cleanup sweep, which would stop the other name's processes (they carry the same run marker);
        the first command ended by itself, and the files it wrote are the other name's too (the same bundle)."""
        self._step(node, "facts")
        config = self.config
        collect = core.collector_args(node, config)
        begun = core.start(
            node, transport, config.python, sweep=True, collect=collect, collect_timeout=config.command_timeout
        )
        identity = begun.identity
        with self._lock:
            self._identities[node.name] = identity
            self._shells[node.name] = begun.shell  # (not the facts' text: at 1,000 nodes it adds up)
            key = identity.key if identity else None
            checked = self._machines.setdefault(key, node.name) if key else node.name
            if checked == node.name:
                return begun
            self._same[node.name] = checked
            self._transports.pop(node.name, None)
        with contextlib.suppress(Exception):
            transport.close()
        return None

    def _distinct(self) -> CheckResult:
        check = registry.get("nodes.distinct")
        selection = self.config.selection
        if not selection.check_selected(check.name):  # still, nothing ran twice on one machine
            return check.not_run(None, selection.why_not_check(check.name))
        finding = connection.distinct_finding(
            [n.name for n in self.nodes], {n.name: n.address for n in self.nodes}, self._same, self._identities
        )
        return check.result(None, finding)

    def _register(self, node: Node, transport: Transport) -> None:
        with self._lock:
            self._transports[node.name] = transport

    def _step(self, node: Node, stage: str) -> None:
        if self._abort.is_set():
            raise core.Aborted
        self.progress(node.name, stage)

    def _connect(self, node: Node) -> tuple[Transport | None, CheckResult]:
        self.progress(node.name, "connecting")
        check = registry.get("connect")
        try:
            connected = self.reach.connect(node, self.run_id, lambda t: self._register(node, t))
        except HostKeyError as exc:
            self._host_key_error = True
            return None, registry.emit(  # the transport's message names the node and the address already
                check.name,
                Status.FAIL,
                str(exc),
                host=node.name,
                remediation="Verify the node's host key out of band and add it to known_hosts "
                "(or rerun with --accept-new-host-keys for a node you have never connected to).",
                data={"host_key": True, **getattr(exc, "data", {})},
            )
        except TransportError as exc:
            message = str(exc) if str(exc).startswith(node.name) else f"{node.name}: {exc}"
            data = getattr(exc, "data", {})
            fix = connection.connect_fix(exc, data)
            return None, registry.emit(check.name, Status.FAIL, message, host=node.name, remediation=fix, data=data)
        if self._abort.is_set():
            raise core.Aborted
        return connected.transport, check.result(node.name, registry.passed(connected.description, **connected.data))
