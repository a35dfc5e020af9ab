"""Reaching the nodes of a detached job after its start (`clustercheck jobs`, `logs`, `stop`): one connection per
node for the command's length, the nodes that cannot be reached named instead of stopping the others."""

from __future__ import annotations

import threading
from collections.abc import Callable

from clustercheck.inventory import Node
from clustercheck.launcher import output
from clustercheck.launcher.job import FOREVER, Echo, HostKeysRefused
from clustercheck.reach import Reach
from clustercheck.stages import nodeprogram
from clustercheck.transport import CommandResult, HostKeyError, Transport, TransportError, new_run_id


class Connections:
    """Connections to NODES for jobs/logs/stop: a short-lived run id of its own, cleaned up at the end."""

    def __init__(self, nodes: list[Node], reach: Reach) -> None:
        self.nodes = nodes
        self.reach = reach
        self.run_id = new_run_id()
        self.transports: dict[str, Transport] = {}
        self.errors: dict[str, str] = {}
        self._lock = threading.Lock()

    def __enter__(self) -> Connections:
        def one(node: Node) -> None:
            def register(transport: Transport) -> None:
                with self._lock:
                    self.transports[node.name] = transport

            try:
                self.reach.connect(node, self.run_id, register)
            except HostKeyError:
                raise
            except TransportError as exc:
                with self._lock:
                    self.errors[node.name] = str(exc)
                    self.transports.pop(node.name, None)

        answers = self.reach.each(one, self.nodes, name=lambda n: n.name)
        for answer in answers.values():
            if isinstance(answer, HostKeyError):
                self.__exit__()
                raise HostKeysRefused(str(answer))
        return self

    def __exit__(self, *exc: object) -> None:
        self.reach.finish(list(self.transports.values()))

    def run(self, argv: Callable[[str], list[str]], timeout: float = 60) -> dict[str, CommandResult]:
        """ARGV(node name) on every reachable node at once."""
        reachable = [n for n in self.nodes if n.name in self.transports]
        answers = self.reach.each(
            lambda n: nodeprogram.run(self.transports[n.name], argv(n.name), timeout=timeout),
            reachable,
            name=lambda n: n.name,
        )
        out = {}
        for i, node in enumerate(reachable):
            answer = answers.get(i)
            out[node.name] = answer if isinstance(answer, CommandResult) else CommandResult(None, "", str(answer))
        return out

    def stream(
        self, argv: list[str], echo: Echo, first_ranks: dict[str, int | None] | None = None
    ) -> dict[str, CommandResult]:
        """ARGV on every reachable node, each node's output echoed as it arrives with node/rank prefixes."""
        lock = threading.Lock()
        reachable = [n for n in self.nodes if n.name in self.transports]

        def one(node: Node) -> CommandResult:
            sink = output.NodeOutput(node.name, (first_ranks or {}).get(node.name))

            def feed(stream: str, text: str) -> None:
                lines = sink.feed(stream, text)
                with lock:
                    for line in lines:
                        echo(line)

            result = nodeprogram.run(self.transports[node.name], argv, timeout=FOREVER, on_output=feed)
            with lock:
                for line in sink.flush():
                    echo(line)
            return result

        answers = self.reach.each(one, reachable, name=lambda n: n.name)
        return {
            node.name: a if isinstance(a, CommandResult) else CommandResult(None, "", str(a))
            for node, a in ((node, answers.get(i)) for i, node in enumerate(reachable))
        }
