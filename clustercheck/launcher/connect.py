"""Reaching every node for a launch: connect through the transport factory, read the home directory, and find the
environment python and the cluster address with the facts collector (unless the preflight collected them), all in
one command per node (core.start)."""

from __future__ import annotations

import threading
from collections.abc import Callable

from clustercheck.facts import collect
from clustercheck.facts.model import NodeFacts
from clustercheck.inventory import Node
from clustercheck.launcher.job import HostKeysRefused, LaunchOptions, NotStarted
from clustercheck.reach import Reach
from clustercheck.stages import core, image
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
        timeout = options.facts_timeout
        collector = None if node.name in known else [str(max(10.0, timeout - 15))]
        begun = core.start(node, transport, options.python, collect=collector, collect_timeout=timeout)
        with lock:
            homes[node.name] = begun.home or "/tmp"
        if node.name in known:
            return known[node.name]
        facts = collect_facts(node, begun, len(nodes), timeout)
        if options.container is not None:  # the environment is the image's (as the preflight reads it)
            facts = image.in_image(node, transport, options.container, facts, collector or [], timeout)
        if facts.torch_problem:
            raise NotStarted(f"{node.name}: {facts.torch_problem}")
        return facts

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


def collect_facts(node: Node, begun: core.NodeStart, cluster_size: int, deadline: float) -> NodeFacts:
    """The facts BEGUN collected (core.start with the collector, within DEADLINE seconds), or NotStarted saying
    why there are none."""
    python, source, missing = begun.python, begun.source, begun.missing
    if begun.error:
        raise NotStarted(f"{node.name}: could not run a command there: {begun.error}")
    if missing:
        raise NotStarted(f"{node.name}: the environment python {missing} ({source}) does not run")
    collected = begun.collected
    if collected is None or collected.raw is None:
        fix = begun.facts_fix()
        problem = begun.facts_problem(deadline) + (f"; {fix}" if fix else "")
        raise NotStarted(f"{node.name}: could not collect facts with {python}: {problem}")
    return collect.build(node, collected.raw, python=python, python_source=source, cluster_size=cluster_size)
