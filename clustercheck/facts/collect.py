"""Turn the collector's JSON (remote/facts.py) into NodeFacts: every raw output parsed once, every "could not
collect" decided here and only here, each field as its declaration says (facts/model.py). Pure logic, no I/O."""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any

from clustercheck.facts import readers
from clustercheck.facts.model import COULD_NOT_COLLECT, Collected, Fact, NodeFacts, Source
from clustercheck.inventory import Node


def build(
    node: Node,
    raw: dict[str, Any],
    *,
    python: str,
    python_source: str,
    python_missing: str | None = None,
    cluster_size: int = 1,
    clock_offset: float | None = None,
    clock_uncertainty: float | None = None,
    **learnt: Any,
) -> NodeFacts:
    """The facts in RAW, with what the caller gives; LEARNT: fields a stage already learnt (image=...)."""
    missing: dict[str, str] = {}
    values: dict[str, Any] = {}
    for f in fields(NodeFacts):
        if "fact" in f.metadata:
            value = _fact(f.metadata["fact"], raw, f.name, missing)
        elif "collected" in f.metadata:
            value = _collected(f.metadata["collected"], raw, f.name, missing)
        else:
            continue
        if value is not _NONE:
            values[f.name] = value
    facts = NodeFacts(
        node=node,
        python=python,
        python_source=python_source,
        python_missing=python_missing,
        cluster_size=cluster_size,
        clock_offset=clock_offset,
        clock_uncertainty=clock_uncertainty,
        missing=missing,
        raw=raw,
        **values,
        **learnt,
    )
    derived = {
        f.name: f.metadata["source"].compute(facts)
        for f in fields(NodeFacts)
        if isinstance(f.metadata.get("source"), Source) and f.metadata["source"].kind == "derived"
    }
    return replace(facts, **derived)


_NONE = object()  # a fact that could not be collected: its field keeps its default


def _fact(declaration: Fact, raw: dict[str, Any], name: str, missing: dict[str, str]) -> Any:
    """A fact a probe reports under its own key, parsed."""
    value = raw.get(declaration.key, {"error": COULD_NOT_COLLECT})
    if isinstance(value, dict) and set(value) == {"error"}:  # the probe failed: what it said
        missing[name] = str(value["error"] or COULD_NOT_COLLECT)
        return _NONE
    try:
        return declaration.parse(value)
    except (TypeError, ValueError, KeyError, AttributeError):
        missing[name] = COULD_NOT_COLLECT
        return _NONE


def _collected(declaration: Collected, raw: dict[str, Any], name: str, missing: dict[str, str]) -> Any:
    """A fact read from the collector's answer under its declaration's keys."""
    commands = raw.get("commands") if isinstance(raw.get("commands"), dict) else {}
    answers = [
        commands.get(key.removeprefix("commands.")) if key.startswith("commands.") else raw.get(key)
        for key in declaration.keys
    ]
    try:
        value = declaration.read(*answers)
    except readers.NotCollected as why:
        missing[name] = why.why
        return _NONE
    if isinstance(value, readers.Noted):
        missing.update(value.notes)
        return value.value
    return value


cluster_interface = readers.cluster_interface  # the interface nodes talk to each other on, and how found


def cluster_address(facts: NodeFacts) -> str:
    """The node's IPv4 address on the cluster interface: the inventory address when it is one of them."""
    import ipaddress

    mine = [str(a.address.ip) for a in facts.addresses or [] if a.iface == facts.interface and a.address.version == 4]
    if facts.node.address in mine:
        return facts.node.address
    if mine:
        return mine[0]
    try:
        return str(ipaddress.ip_address(facts.node.address))
    except ValueError:
        return facts.node.address
