"""What the hosts' runs leave for the rest of the run: each node's transport, results and facts, what its first
command read (its identity and login shell), which nodes are the same machine as another, and whether a host key
was refused. The hosts run in parallel threads (run/hosts.py), so every change is made under one lock; the
multi-node stages and the report read it once the hosts are done.
"""

from __future__ import annotations

import threading

from clustercheck.facts import parse
from clustercheck.facts.model import NodeFacts
from clustercheck.inventory import Node
from clustercheck.model import CheckResult
from clustercheck.transport import Transport


class RunRecord:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.transports: dict[str, Transport] = {}
        self.results: dict[str, list[CheckResult]] = {}
        self.facts: dict[str, NodeFacts] = {}
        self.host_key_error = False
        self.identities: dict[str, parse.Identity | None] = {}  # node -> the identity its first command read
        self._machines: dict[tuple[str, str, str], str] = {}  # identity key -> the node checked as that machine
        self.same: dict[str, str] = {}  # node -> the node checked in its place (the same machine)
        self.shells: dict[str, str | None] = {}  # node -> its login shell, as its first command read it

    def register(self, name: str, transport: Transport) -> None:
        with self._lock:
            self.transports[name] = transport

    def refused_host_key(self) -> None:
        with self._lock:
            self.host_key_error = True

    def collected(self, name: str, facts: NodeFacts) -> None:
        with self._lock:
            self.facts[name] = facts

    def host_done(self, name: str, results: list[CheckResult]) -> None:
        with self._lock:
            self.results[name] = results

    def add_results(self, name: str, results: list[CheckResult]) -> None:
        with self._lock:
            self.results.setdefault(name, []).extend(results)

    def first_command(self, name: str, identity: parse.Identity | None, shell: str | None) -> str:
        """What node NAME's first command read: its IDENTITY and login SHELL. Returns the node checked as that
        machine: NAME, or the node that reached it first under another name (then NAME's transport is dropped)."""
        with self._lock:
            self.identities[name] = identity
            self.shells[name] = shell  # (not the facts' text: at 1,000 nodes it adds up)
            key = identity.key if identity else None
            checked = self._machines.setdefault(key, name) if key else name
            if checked != name:
                self.same[name] = checked
                self.transports.pop(name, None)
            return checked

    def open_transports(self) -> list[Transport]:
        with self._lock:
            return list(self.transports.values())

    def reached(self, nodes: list[Node]) -> list[NodeFacts]:
        """The facts of NODES that were collected, in inventory order."""
        return [self.facts[n.name] for n in nodes if n.name in self.facts]

    def ready(self, name: str) -> bool:
        """Whether node NAME's facts were collected and its transport is open (a multi-node stage can use it)."""
        return name in self.facts and name in self.transports
