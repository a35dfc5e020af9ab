"""The core stage on one host, as the run's threads run it for every node at once: connect, the node's first command
(which machine it is, its python, its facts), the core stage's checks; and, at the end of the run, its ssh.session
check. What each host leaves goes into the run's record (run/record.py); a bug in one host's run is that host's
internal ERROR, never the others'.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from clustercheck.checks import connection, registry
from clustercheck.inventory import Node
from clustercheck.model import CheckResult, Status
from clustercheck.reach import Reach
from clustercheck.run.abort import Abort
from clustercheck.run.record import RunRecord
from clustercheck.stages import Context, core, image
from clustercheck.transport import HostKeyError, Transport, TransportError


@dataclass(frozen=True)
class HostRun:
    ctx: Context
    reach: Reach
    run_id: str
    record: RunRecord
    abort: Abort
    later: bool  # a multi-node stage follows: each host's transport stays open for it

    def __call__(self, node: Node) -> None:
        if self.abort.is_set():
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
                outcome = core.run_host(
                    node, transport, self.ctx, lambda stage: self.abort.step(node.name, stage), begun
                )
                results += outcome.results
                if outcome.facts is not None:
                    self.record.collected(node.name, outcome.facts)
        except core.Aborted:
            return
        except Exception as exc:  # a bug in one host's run must not hide the other hosts' results
            results.append(
                registry.get("internal").result(
                    node.name, registry.Finding(Status.ERROR, f"clustercheck failed: {type(exc).__name__}: {exc}")
                )
            )
        finally:
            # The transport stays open for the multi-node stages; the pipeline cleans every node up at the end
            # (and nothing needs stopping before that when no multi-node stage follows).
            if transport is not None and not self.abort.is_set() and self.later:
                with contextlib.suppress(Exception):
                    transport.stop()
        self.ctx.progress(node.name, "done")
        self.record.host_done(node.name, results)

    def session(self, node: Node) -> list[CheckResult]:
        """ssh.session for NODE: what its sshd did through the whole run (nothing where its first command did not
        run, or it was closed as another name of a machine)."""
        transport = self.record.transports.get(node.name)
        if transport is None or node.name not in self.record.shells:
            return []
        return [core.session(node, transport, self.record.shells[node.name])]

    def _begin(self, node: Node, transport: Transport) -> core.NodeStart | None:
        """The node's first command (core.start: its identity, python and facts), or None when NODE is a machine
        another inventory name already reached. Nothing more runs under the second name: its transport is closed
        without the cleanup sweep, which would stop the other name's processes (they carry the same run marker);
        the first command ended by itself, and the files it wrote are the other name's too (the same bundle)."""
        self.abort.step(node.name, "facts")
        config = self.ctx.config
        collect = image.collector_args(node, config)
        begun = core.start(
            node,
            transport,
            config.python,
            sweep=True,
            collect=collect,
            collect_timeout=config.command_timeout,
            paths=core.job_paths(config.data_paths, config.shared_dir),
        )
        if self.record.first_command(node.name, begun.identity, begun.shell) == node.name:
            return begun
        with contextlib.suppress(Exception):
            transport.close()
        return None

    def _connect(self, node: Node) -> tuple[Transport | None, CheckResult]:
        self.ctx.progress(node.name, "connecting")
        check = registry.get("connect")
        try:
            connected = self.reach.connect(node, self.run_id, lambda t: self.record.register(node.name, t))
        except HostKeyError as exc:
            self.record.refused_host_key()
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
        self.abort.check()
        return connected.transport, check.result(node.name, registry.passed(connected.description, **connected.data))
