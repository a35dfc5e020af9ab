"""Reaching every node for a launch: connect through the transport factory, read the home directory, and find the
environment python and the cluster address with the facts collector (unless the preflight collected them)."""

from __future__ import annotations

import threading
from collections.abc import Callable

from clustercheck.facts import collect
from clustercheck.facts.model import NodeFacts
from clustercheck.inventory import Node
from clustercheck.launcher.job import HostKeysRefused, LaunchOptions, NotStarted
from clustercheck.reach import Reach
from clustercheck.stages import core
from clustercheck.transport import HostKeyError, Transport, TransportError

Register = Callable[[Node, Transport], None]  # receives each node's transport before it connects (to clean it up)


def node_facts(
    nodes: list[Node],
    options: LaunchOptions,
    reach: Reach,
    job_id: str,
    known: dict[str, NodeFacts],
    register: Register,
) -> tuple[dict[str, NodeFacts], dict[str, str]]:
    """Every node's facts (KNOWN ones are not collected again) and home directory. Raises NotStarted."""
    homes: dict[str, str] = {}
    lock = threading.Lock()

    def one(node: Node) -> NodeFacts:
        transport = reach.connect(node, job_id, lambda t: register(node, t)).transport
        home = transport.run(["sh", "-c", 'echo "$HOME"'], timeout=30).stdout.strip()
        with lock:
            homes[node.name] = home or "/tmp"
        if node.name in known:
            return known[node.name]
        return collect_facts(node, transport, options, len(nodes))

    answers = reach.each(one, nodes, name=lambda n: n.name)
    for i, node in enumerate(nodes):
        answer = answers.get(i, NotStarted(f"{node.name}: no answer"))
        if isinstance(answer, BaseException):
            if isinstance(answer, HostKeyError):
                raise HostKeysRefused(str(answer))
            if isinstance(answer, NotStarted | TransportError):
                raise NotStarted(str(answer) if str(answer).startswith(node.name) else f"{node.name}: {answer}")
            raise answer
    return {node.name: answers[i] for i, node in enumerate(nodes)}, homes  # type: ignore[return-value]


def collect_facts(node: Node, transport: Transport, options: LaunchOptions, cluster_size: int) -> NodeFacts:
    python, source, missing = core.find_python(node, transport, options.python)
    if missing:
        raise NotStarted(f"{node.name}: the environment python {missing} ({source}) does not run")
    timeout = options.facts_timeout
    raw, got = core.collect_raw(transport, python, timeout, str(max(10.0, timeout - 15)))
    if raw is None:
        raise NotStarted(f"{node.name}: could not collect facts with {python}: {got.cause()}")
    facts = collect.build(node, raw, python=python, python_source=source, cluster_size=cluster_size)
    if facts.torch_problem:
        raise NotStarted(f"{node.name}: {facts.torch_problem}")
    return facts
