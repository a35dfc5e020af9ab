"""Run the checks on every node in parallel, then across nodes.

Per host: connect, measure the clock offset, find the environment's python,
run the facts collector, judge the facts, run the node-local collectives,
clean up. Hosts run in parallel under a cap (--forks); each host's steps are
bounded by the connect timeouts and per-command deadlines, so a hung or dead
host never holds back the others' results beyond its timeouts. On Ctrl-C every
host's processes are killed before clustercheck exits.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import paramiko

from clustercheck import checks, consistency, nodecollectives, stages
from clustercheck.checks import NodeFacts
from clustercheck.inventory import Node
from clustercheck.model import CheckResult, Status
from clustercheck.ssh import HostKeyError, SSHTransport, Timeouts, known_hosts_name, resolve
from clustercheck.transport import LocalTransport, Transport, TransportError, new_run_id

RECORDED_PYTHON = "/etc/clustercheck/python"


@dataclass
class Options:
    run_dir: Path
    python: str | None = None  # --python: the same environment python on every node
    forks: int = 32
    command_timeout: float = 120.0  # the facts collector
    collectives_timeout: float = 300.0  # torchrun on one node
    nproc_per_node: int | None = None
    master_port: int = 29500
    timeouts: Timeouts = field(default_factory=Timeouts)
    accept_new_host_keys: bool = False
    known_hosts: list[str] | None = None
    ssh_config: paramiko.SSHConfig | None = None
    skip: list[str] = field(default_factory=list)
    clock_bound: float = consistency.DEFAULT_MAX_CLOCK_OFFSET
    stages: tuple[str, ...] = stages.DISTRIBUTED  # the multi-node stages to run, after the per-node phase
    why_not_selected: str = "not selected"
    min_busbw: str | None = None  # --min-busbw, else the inventory's clustercheck_min_busbw
    network_duration: float = 10.0
    ddp_steps: int | None = None  # test-only: make the DDP job long


@dataclass
class Outcome:
    results: list[CheckResult]
    host_key_error: bool = False


Progress = Callable[[str, str], None]


class Aborted(Exception):
    pass


class Pipeline:
    def __init__(self, nodes: list[Node], options: Options, progress: Progress | None = None) -> None:
        self.nodes = nodes
        self.options = options
        self.progress = progress or (lambda host, stage: None)
        self.run_id = new_run_id()
        self._abort = threading.Event()
        self._lock = threading.Lock()
        self._transports: dict[str, Transport] = {}
        self._results: dict[str, list[CheckResult]] = {}
        self._facts: dict[str, NodeFacts] = {}
        self._host_key_error = False

    # ------------------------------------------------------------------ the whole run

    def run(self) -> Outcome:
        slots = threading.Semaphore(self.options.forks)
        threads = []
        for node in self.nodes:
            thread = threading.Thread(target=self._host_thread, args=(node, slots), daemon=True, name=node.name)
            threads.append(thread)
            thread.start()
        try:
            for thread in threads:
                while thread.is_alive():
                    thread.join(0.2)
        except BaseException:  # Ctrl-C or SIGTERM: kill what we started everywhere, then let it propagate
            self.abort()
            raise
        try:
            results = []
            for node in self.nodes:
                results += self._results.get(node.name, [])
            reached = [self._facts[n.name] for n in self.nodes if n.name in self._facts]
            results += self._skip_filter(consistency.run_consistency(reached, self.options.clock_bound))
            results += self._skip_filter(self._multinode())
        except BaseException:
            self.abort()
            raise
        for node in self.nodes:
            self.progress(node.name, "cleaning up")
        self.abort()  # the transports stay open for the multi-node stages; now every node is cleaned up
        for node in self.nodes:
            self.progress(node.name, "done")
        return Outcome(results, self._host_key_error)

    def _multinode(self) -> list[CheckResult]:
        members, missing = [], {}
        for node in self.nodes:
            facts = self._facts.get(node.name)
            transport = self._transports.get(node.name)
            if facts is None or transport is None:
                missing[node.name] = "not reached, or its facts were not collected"
                continue
            interface, _ = consistency.cluster_interface(facts)
            members.append(stages.member(node, transport, facts, interface, one_node=len(self.nodes) == 1))
        options = stages.StageOptions(
            local_dir=self.options.run_dir,
            stages=self.options.stages,
            master_port=self.options.master_port,
            nproc_per_node=self.options.nproc_per_node,
            timeout=self.options.collectives_timeout,
            min_busbw=self.options.min_busbw or _inventory_min_busbw(self.nodes),
            network_duration=self.options.network_duration,
            ddp_steps=self.options.ddp_steps,
            why_not_selected=self.options.why_not_selected,
        )
        if self._abort.is_set():
            raise Aborted
        return stages.run_stages(members, missing, options, self.progress)

    def abort(self) -> None:
        """Stop every host: kill this run's processes on every node (in parallel, bounded), then disconnect."""
        self._abort.set()
        with self._lock:
            transports = list(self._transports.values())

        def finish(transport: Transport) -> None:
            with contextlib.suppress(Exception):
                transport.cleanup()
            with contextlib.suppress(Exception):
                transport.close()

        cleaners = [threading.Thread(target=finish, args=(t,), daemon=True) for t in transports]
        for thread in cleaners:
            thread.start()
        deadline = time.monotonic() + 30
        for thread in cleaners:
            thread.join(max(0.1, deadline - time.monotonic()))

    # ------------------------------------------------------------------ one host

    def _host_thread(self, node: Node, slots: threading.Semaphore) -> None:
        with slots:
            if self._abort.is_set():
                return
            host_dir = self.options.run_dir / "hosts" / node.name
            host_dir.mkdir(parents=True, exist_ok=True)
            transport: Transport | None = None
            results: list[CheckResult] = []
            try:
                transport, connect_result = self._connect(node)
                results.append(connect_result)
                if transport is not None:
                    results += self._check_host(node, transport, host_dir)
            except Aborted:
                return
            except Exception as exc:  # a bug in one host's run must not hide the other hosts' results
                results.append(
                    CheckResult(
                        "internal",
                        Status.ERROR,
                        f"{node.name}: clustercheck failed: {type(exc).__name__}: {exc}",
                        host=node.name,
                    )
                )
            finally:
                # The transport stays open for the multi-node stages; run() cleans every node up at the end.
                if transport is not None and not self._abort.is_set():
                    with contextlib.suppress(Exception):
                        transport.stop()
            self.progress(node.name, "done")
            with self._lock:
                self._results[node.name] = results

    def _connect(self, node: Node) -> tuple[Transport | None, CheckResult]:
        self.progress(node.name, "connecting")
        if node.is_local:
            transport: Transport = LocalTransport(node.name, self.run_id)
            self._register(node, transport)
            return transport, CheckResult("connect", Status.PASS, f"{node.name}: local", host=node.name)
        try:
            params = resolve(node, self.options.ssh_config, self.options.known_hosts)
        except (ValueError, TransportError) as exc:
            return None, CheckResult("connect", Status.FAIL, f"{node.name}: {exc}", host=node.name)
        ssh = SSHTransport(
            node,
            params,
            run_id=self.run_id,
            timeouts=self.options.timeouts,
            accept_new_host_keys=self.options.accept_new_host_keys,
            config=self.options.ssh_config,
        )
        self._register(node, ssh)
        try:
            ssh.connect()
        except HostKeyError as exc:
            self._host_key_error = True
            return None, CheckResult(
                "connect",
                Status.FAIL,
                str(exc),
                host=node.name,
                remediation="Verify the node's host key out of band and add it to known_hosts "
                "(or rerun with --accept-new-host-keys for a node you have never connected to).",
                data={"host_key": True, "hostname": params.hostname, "port": params.port},
            )
        except TransportError as exc:
            return None, CheckResult(
                "connect",
                Status.FAIL,
                str(exc),
                host=node.name,
                remediation="Check that the node is up, that sshd answers on that port, and the SSH user and key.",
                data={"hostname": params.hostname, "port": params.port},
            )
        if self._abort.is_set():
            raise Aborted
        user = params.user or "(default user)"
        return ssh, CheckResult(
            "connect",
            Status.PASS,
            f"{node.name}: SSH to {known_hosts_name(params.hostname, params.port)} as {user}, host key verified",
            host=node.name,
            data={"hostname": params.hostname, "port": params.port, "user": params.user},
        )

    def _register(self, node: Node, transport: Transport) -> None:
        with self._lock:
            self._transports[node.name] = transport

    def _step(self, node: Node, stage: str) -> None:
        if self._abort.is_set():
            raise Aborted
        self.progress(node.name, stage)

    def _check_host(self, node: Node, transport: Transport, host_dir: Path) -> list[CheckResult]:
        self._step(node, "clock")
        offset, uncertainty = measure_clock_offset(transport)
        self._step(node, "python")
        python, source, missing = self._find_python(node, transport)
        self._step(node, "facts")
        collector = f"{transport.workdir}/facts.py"
        with tempfile.TemporaryDirectory() as tmp:
            local = Path(tmp) / "facts.py"
            local.write_text(resources.files("clustercheck.worker").joinpath("facts.py").read_text())
            try:
                transport.put(str(local), collector)
            except (TransportError, OSError) as exc:
                return [CheckResult("facts", Status.ERROR, f"{node.name}: {exc}", host=node.name)]
        args = [python, collector, str(max(10.0, self.options.command_timeout - 15))]
        if missing:
            args.append("--no-torch")
        started = time.monotonic()
        collected = transport.run(args, timeout=self.options.command_timeout)
        (host_dir / "facts.json").write_text(collected.stdout)
        (host_dir / "facts.stderr").write_text(collected.stderr)
        raw = None
        if collected.ok:
            with contextlib.suppress(ValueError, IndexError):
                raw = json.loads(collected.stdout.strip().splitlines()[-1])
        if not isinstance(raw, dict):
            cause = (
                f"timed out after {self.options.command_timeout:.0f} s" if collected.timed_out else collected.cause()
            )
            return [
                CheckResult(
                    "facts",
                    Status.ERROR,
                    f"{node.name}: could not collect facts with {python}: {cause}",
                    host=node.name,
                    remediation="Look at facts.stderr in the run directory; check that python3 runs on the node.",
                )
            ]
        facts = NodeFacts(
            node=node,
            python=python,
            python_source=source,
            python_missing=missing,
            raw=raw,
            cluster_size=len(self.nodes),
            clock_offset=offset,
            clock_uncertainty=uncertainty,
        )
        results = [
            CheckResult(
                "facts",
                Status.PASS,
                f"{node.name}: facts collected with {python} in {time.monotonic() - started:.1f} s",
                host=node.name,
            )
        ]
        results += self._skip_filter(checks.run_checks(facts))
        with self._lock:
            self._facts[node.name] = facts
        self._step(node, "collectives on the node")
        results += self._node_collectives(node, transport, facts, host_dir)
        return results

    def _node_collectives(
        self, node: Node, transport: Transport, facts: NodeFacts, host_dir: Path
    ) -> list[CheckResult]:
        if len(self.nodes) == 1 and "collectives" in self.options.stages:
            return []  # on one node the collectives stage is this very job
        if all(self._skipped(name) for name in nodecollectives.NAMES):
            return self._skip_filter(nodecollectives.skipped(node.name, "--skip"))
        torch = facts.torch
        if "error" in torch or facts.python_missing:
            return nodecollectives.skipped(node.name, "torch does not import")
        gpus = torch.get("device_count") or 0 if torch.get("cuda_available") else 0
        return self._skip_filter(
            nodecollectives.run(
                transport,
                facts.python,
                gpus,
                host_dir,
                nproc=self.options.nproc_per_node,
                timeout=self.options.collectives_timeout,
                port=self.options.master_port,
            )
        )

    def _skipped(self, name: str) -> bool:
        return _matches(name, self.options.skip)

    def _skip_filter(self, results: list[CheckResult]) -> list[CheckResult]:
        return [_skip(r) if _matches(r.name, self.options.skip) else r for r in results]

    def _find_python(self, node: Node, transport: Transport) -> tuple[str, str, str | None]:
        """(python to run the collector with, where it came from, the configured python when it is missing)."""
        if self.options.python:
            python, source = self.options.python, "--python"
        elif node.python:
            python, source = node.python, "clustercheck_python in the inventory"
        else:
            recorded = transport.run(["cat", RECORDED_PYTHON], timeout=30)
            if recorded.ok and recorded.stdout.strip():
                python, source = recorded.stdout.strip(), RECORDED_PYTHON
            elif node.is_local:
                python, source = sys.executable, "the python running clustercheck"
            else:
                python, source = "python3", "default"
        probe = transport.run([python, "-c", "import sys; print(sys.executable)"], timeout=30)
        if probe.ok:
            return python, source, None
        return "python3", source, python


def _inventory_min_busbw(nodes: list[Node]) -> str | None:
    """clustercheck_min_busbw from the inventory (the first node that sets it; a group var sets it for all)."""
    for node in nodes:
        if node.min_busbw:
            return node.min_busbw
    return None


def measure_clock_offset(transport: Transport, samples: int = 3) -> tuple[float | None, float | None]:
    """Node clock minus control clock, from the sample with the shortest round trip; (offset, half round trip)."""
    best: tuple[float, float] | None = None
    for _ in range(samples):
        before = time.time()
        answer = transport.run(["date", "+%s.%N"], timeout=15)
        after = time.time()
        if not answer.ok:
            continue
        try:
            remote = float(answer.stdout.strip())
        except ValueError:
            continue
        half_rtt = (after - before) / 2
        if best is None or half_rtt < best[1]:
            best = (remote - (before + half_rtt), half_rtt)
    return best if best else (None, None)


def _matches(name: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def _skip(result: CheckResult) -> CheckResult:
    result.status = Status.SKIP
    result.message = f"{result.host + ': ' if result.host else ''}{result.name} skipped (--skip)"
    result.remediation = ""
    return result
