"""The configuration files the roles write, as one node has them (the collector's `managed_files`, read by
clustercheck/remote/managed.py): each file's hash, size and, where it may be shown, its text. Pure, no I/O."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Copy:
    """One node's copy of a managed file: its SHA-256 and size, its text where the node sent it (None: a secret, or
    too large), or why it could not be read."""

    role: str
    sha256: str | None = None
    size: int | None = None
    text: str | None = None
    error: str | None = None


@dataclass(frozen=True)
class ManagedFiles:
    """The managed files present on a node, by path, and slurmctld's log lines saying a node's slurm.conf differs
    (where this node is Slurm's controller)."""

    files: dict[str, Copy]
    slurmctld: tuple[str, ...] = ()

    @classmethod
    def from_probe(cls, value: dict[str, Any]) -> ManagedFiles:
        files = {}
        for path, entry in value["files"].items():
            if entry.get("error"):
                files[str(path)] = Copy(str(entry.get("role", "")), error=str(entry["error"]))
                continue
            text = entry.get("text")
            files[str(path)] = Copy(
                str(entry["role"]), str(entry["sha256"]), int(entry["size"]), text if isinstance(text, str) else None
            )
        return cls(files, tuple(str(line) for line in value.get("slurmctld") or ()))
