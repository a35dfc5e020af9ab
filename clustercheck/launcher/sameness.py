"""The same code on every node: the script's directory hashed on each node, and the nodes compared (pure logic;
the hashing runs on the node as a short program of the standard library, Python 3.8+: remote/codetree.py).

What counts as the code (`code_files`, the one definition: the hashing on the nodes and `--sync`'s archive both
use it): every file under the script's directory but the directories in SKIP_DIRS (environments, version
control, caches, clustercheck's own run directories), `*.pyc`, what the directory's `.gitignore` ignores, and the
run directory of the launch itself. Each file counts by path and SHA-256.

What a run wrote is not the code either: a checkpoint or `lightning_logs/` that rank 0 writes beside the script
exists on the first node only. Every launch from a directory (without --sync) is recorded on each node
(~/.local/state/clustercheck/code/), with the files compared and when its job ran; a file that appeared while an
earlier launch ran, and that was not part of its code, is that run's output and is left out of the comparison
(named, never hashed). A file the user adds afterwards is compared as usual.

A directory too large to hash quickly (data kept beside the code) is refused with the way out: --sync a code
directory, or add the data to the directory's .gitignore.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field

from clustercheck.remote.codetree import KEPT_LAUNCHES, SKIP_DIRS, SKIP_SUFFIXES, code_files
from clustercheck.stages import bundle, nodeprogram

__all__ = ["KEPT_LAUNCHES", "SKIP_DIRS", "SKIP_SUFFIXES", "code_files"]  # the node's definitions, read here too

MAX_FILES = 5000
MAX_BYTES = 512 * 1024 * 1024
SHOWN = 3  # differing files named per node
EXCLUDED = "`.venv`, `venv`, `.git`, `__pycache__`, `*.pyc`, `clustercheck-runs`, the .gitignore's patterns"
PROGRAM = "codetree"  # remote/codetree.py: the hashing and the launches' record on the node


@dataclass(frozen=True)
class Tree:
    """The script's directory as one node sees it."""

    script: str = ""
    directory: str = ""
    files: dict[str, str] = field(default_factory=dict)  # relative path -> SHA-256
    error: str | None = None
    outputs: dict[str, float] = field(default_factory=dict)  # relative path -> mtime: what earlier launches wrote


def command(python: str, script: str, cwd: str | None, skip_paths: tuple[str, ...] = ()) -> list[str]:
    """Hash the script's directory on a node; SKIP_PATHS: absolute paths left out (the launch's run directory)."""
    return [
        python,
        "-c",
        bundle.source(PROGRAM),
        "hash",
        script,
        cwd or "",
        str(MAX_FILES),
        str(MAX_BYTES),
        json.dumps(skip_paths),
    ]


def begin_command(python: str, tree: Tree, job: str, detached: bool) -> tuple[list[str], str]:
    """(argv, stdin) recording on a node, just before JOB starts there, the code it runs and what was left out."""
    given = json.dumps({"files": sorted(tree.files), "outputs": tree.outputs})
    return [python, "-c", bundle.source(PROGRAM), "begin", tree.directory, job, "1" if detached else "0"], given


def end_command(python: str, directory: str, job: str) -> list[str]:
    """Recording on a node that the foreground JOB from DIRECTORY ended."""
    return [python, "-c", bundle.source(PROGRAM), "end", directory, job]


def parse(stdout: str) -> Tree:
    """The hashing program's output; anything but its answer is a Tree with the error."""
    doc = nodeprogram.last_json(stdout)
    if not isinstance(doc, dict):
        return Tree(error=f"could not hash the script's directory: {stdout.strip()[-200:] or 'no output'}")
    return tree(doc)


def tree(doc: dict) -> Tree:
    """The hashing program's answer (its JSON object, as nodeprogram reads it)."""
    return Tree(
        doc.get("script", ""),
        doc.get("directory", ""),
        dict(doc.get("files") or {}),
        doc.get("error"),
        dict(doc.get("outputs") or {}),
    )


def unusable(trees: dict[str, Tree]) -> list[str]:
    """One line per node whose directory could not be compared at all (no script, too large, unreadable)."""
    out = []
    for name, tree in trees.items():
        if tree.error == "no such file":
            out.append(f"{name}: {tree.script} does not exist")
        elif tree.error == "too large":
            out.append(
                f"{name}: {tree.directory} holds more than {MAX_FILES} files or {MAX_BYTES >> 20} MiB besides "
                f"{EXCLUDED}: too large to compare; pass --sync with a directory of the code alone, or add what is "
                f"not code (data, checkpoints, environments) to {tree.directory}/.gitignore"
            )
        elif tree.error:
            out.append(f"{name}: {tree.error}")
    return out


def problems(trees: dict[str, Tree]) -> list[str]:
    """One line per node whose script or directory differs from the first node's; [] when every node has the same
    files with the same content. TREES is in inventory order; call it once unusable(TREES) is []."""
    out: list[str] = []
    names = list(trees)
    reference_name = names[0]
    reference = trees[reference_name]
    for name in names[1:]:
        tree = trees[name]
        if tree.directory != reference.directory:
            out.append(f"{name}: the script is {tree.script}, on {reference_name} {reference.script}")
            continue
        missing = sorted(set(reference.files) - set(tree.files))
        extra = sorted(set(tree.files) - set(reference.files))
        changed = sorted(p for p in set(reference.files) & set(tree.files) if reference.files[p] != tree.files[p])
        parts = []
        for label, paths in (("differs", changed), ("missing", missing), ("only there", extra)):
            if paths:
                parts.append(f"{label}: {shown(paths)}")
        if parts:
            out.append(f"{name}: {'; '.join(parts)} (compared with {reference_name}'s {reference.directory})")
    return out


def shown(paths: list[str]) -> str:
    return ", ".join(paths[:SHOWN]) + (f" and {len(paths) - SHOWN} more" if len(paths) > SHOWN else "")


def local_files(directory: str, skip_paths: tuple[str, ...] = ()) -> Iterator[tuple[str, str]]:
    """The code under a local DIRECTORY (what --sync uploads), by the same rules as on the nodes."""
    return code_files(os.path.abspath(directory), skip_paths)
