"""How commands reach the nodes: one small interface the pipeline, the torch-job runner and the launcher all use.

A Reach connects to a node (a Transport: commands on that one node), runs a function on each node at once,
starts a command in the background on a node, stops what the run started on nodes, and finishes them (cleanup
and disconnect). `Fanout` is the one implementation today: SSH (or the local transport) through a transport
factory, one thread per node. Another way to reach nodes (srun under a Slurm allocation) is another Reach; the
runner and the pipeline do not change.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable
from typing import Protocol, TypeVar

from clustercheck.fanout import fanout
from clustercheck.inventory import Node
from clustercheck.transport import CommandResult, OutputSink, Transport
from clustercheck.transport.factory import Connected, Factory

T = TypeVar("T")
R = TypeVar("R")

STOP_WAIT = 60.0  # seconds stopping every node may take together
FINISH_WAIT = 60.0  # seconds the cleanup of every node may take together, unless the caller says otherwise


class Started:
    """A command started in the background on one node: its result once it ended, and when it ended."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.result: CommandResult | None = None
        self.ended_at: float | None = None
        self._done = threading.Event()

    def alive(self) -> bool:
        return not self._done.is_set()

    def join(self, timeout: float | None = None) -> bool:
        """Wait at most TIMEOUT seconds for the command's end; whether it ended."""
        return self._done.wait(timeout)

    def _end(self, result: CommandResult) -> None:
        self.result, self.ended_at = result, time.monotonic()
        self._done.set()


Ended = Callable[[str, CommandResult], None]  # node name, its command's result: called as the command ends


class Reach(Protocol):
    """The way commands reach the nodes."""

    def connect(self, node: Node, run_id: str, register: Callable[[Transport], None]) -> Connected:
        """A connected transport to NODE; REGISTER receives it before it connects (so a cleanup can reach it).
        Raises TransportError (HostKeyError for a refused host key)."""
        ...

    def each(
        self,
        function: Callable[[T], R],
        items: Iterable[T],
        *,
        limit: int | None = None,
        timeout: float | None = None,
        name: Callable[[T], str] = str,
    ) -> dict[int, R | BaseException]:
        """FUNCTION on every item (a node, a member, a transport) at once: index -> its value or its exception;
        the calls still running after TIMEOUT are left out."""
        ...

    def start(
        self,
        name: str,
        transport: Transport,
        command: list[str],
        *,
        timeout: float,
        env: dict[str, str] | None = None,
        on_output: OutputSink | None = None,
        ended: Ended | None = None,
    ) -> Started:
        """COMMAND started on the node in the background; a broken connection is that command's failure
        (no exit status, the error as its stderr). ENDED(name, result) is called as it ends."""
        ...

    def stop(self, transports: list[Transport]) -> None:
        """Every process this run started on those nodes killed (the run-marker sweep), bounded in time."""
        ...

    def finish(self, transports: list[Transport], timeout: float = FINISH_WAIT) -> dict[str, str]:
        """Every node cleaned up (the run's processes killed, its work directory removed) and disconnected;
        returns node -> why it could not be cleaned up."""
        ...


class Fanout:
    """The nodes reached over SSH (or locally) through a transport factory, one thread per node."""

    def __init__(self, factory: Factory) -> None:
        self.factory = factory

    def connect(self, node: Node, run_id: str, register: Callable[[Transport], None]) -> Connected:
        return self.factory(node, run_id, register)

    each = staticmethod(fanout)

    def start(
        self,
        name: str,
        transport: Transport,
        command: list[str],
        *,
        timeout: float,
        env: dict[str, str] | None = None,
        on_output: OutputSink | None = None,
        ended: Ended | None = None,
    ) -> Started:
        started = Started(name)

        def run() -> None:
            try:
                result = transport.run(command, timeout=timeout, env=env, on_output=on_output)
            except Exception as exc:  # the connection broke: that node's command failed
                result = CommandResult(None, "", f"{type(exc).__name__}: {exc}")
            try:
                if ended is not None:
                    ended(name, result)
            finally:
                started._end(result)

        threading.Thread(target=run, daemon=True, name=name).start()
        return started

    def stop(self, transports: list[Transport]) -> None:
        fanout(lambda t: t.stop(), transports, timeout=STOP_WAIT, name=lambda t: t.host)

    def finish(self, transports: list[Transport], timeout: float = FINISH_WAIT) -> dict[str, str]:
        unclean: dict[str, str] = {}

        def finish(transport: Transport) -> None:
            try:
                transport.cleanup()
            except Exception as exc:
                unclean[transport.host] = str(exc).removeprefix(f"{transport.host}: ") or type(exc).__name__
            with contextlib.suppress(Exception):
                transport.close()

        outcomes = fanout(finish, transports, timeout=timeout, name=lambda t: t.host)
        for i, transport in enumerate(transports):
            if i not in outcomes:
                unclean.setdefault(transport.host, f"no answer within {timeout:.0f} s")
        return unclean


def cleanup_message(unclean: dict[str, str]) -> str:
    """What the closing line says about the nodes whose processes could not be stopped (UNCLEAN: node -> why, as
    finish() returns it)."""
    if not unclean:
        return "processes started on the nodes were stopped"
    where = "; ".join(f"{node} ({why})" for node, why in sorted(unclean.items()))
    return (
        f"could not stop the processes started on {where}: they end by themselves at their deadline, and the "
        "next run stops whatever is left"
    )
