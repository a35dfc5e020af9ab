"""The same code on every node: the script's directory hashed on each node, and the nodes compared (pure logic;
the hashing runs on the node as a short program of the standard library, Python 3.8+).

Every file under the script's directory counts (not __pycache__, .git, *.pyc), by path and SHA-256. A directory
too large to hash quickly (data kept beside the code) is refused with the way out: --sync a code directory.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

MAX_FILES = 5000
MAX_BYTES = 512 * 1024 * 1024
SHOWN = 3  # differing files named per node

# argv: SCRIPT, WORKING DIRECTORY ("" for the current one), MAX_FILES, MAX_BYTES. Prints one JSON document.
_HASH = r"""
import hashlib, json, os, sys
script, cwd, max_files, max_bytes = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
base = os.path.expanduser(cwd) if cwd else os.getcwd()
path = os.path.normpath(os.path.join(base, os.path.expanduser(script)))
if not os.path.isfile(path):
    print(json.dumps({"script": path, "error": "no such file"}))
    sys.exit(0)
top = os.path.dirname(path)
files, total = {}, 0
for root, dirs, names in os.walk(top):
    dirs[:] = sorted(d for d in dirs if d not in ("__pycache__", ".git"))
    for name in sorted(names):
        if name.endswith(".pyc"):
            continue
        full = os.path.join(root, name)
        if not os.path.isfile(full):
            continue
        total += os.path.getsize(full)
        if len(files) >= max_files or total > max_bytes:
            print(json.dumps({"script": path, "error": "too large", "directory": top}))
            sys.exit(0)
        digest = hashlib.sha256()
        try:
            with open(full, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    digest.update(block)
        except OSError as exc:
            print(json.dumps({"script": path, "error": "unreadable: %s" % exc}))
            sys.exit(0)
        files[os.path.relpath(full, top)] = digest.hexdigest()
print(json.dumps({"script": path, "directory": top, "files": files}))
"""


@dataclass(frozen=True)
class Tree:
    """The script's directory as one node sees it."""

    script: str = ""
    directory: str = ""
    files: dict[str, str] = field(default_factory=dict)  # relative path -> SHA-256
    error: str | None = None


def command(python: str, script: str, cwd: str | None) -> list[str]:
    return [python, "-c", _HASH, script, cwd or "", str(MAX_FILES), str(MAX_BYTES)]


def parse(stdout: str) -> Tree:
    """The hashing program's answer; anything else is a Tree with the error."""
    try:
        doc = json.loads(stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return Tree(error=f"could not hash the script's directory: {stdout.strip()[-200:] or 'no output'}")
    if not isinstance(doc, dict):
        return Tree(error="could not hash the script's directory")
    return Tree(doc.get("script", ""), doc.get("directory", ""), dict(doc.get("files") or {}), doc.get("error"))


def problems(trees: dict[str, Tree]) -> list[str]:
    """One line per node whose script or directory is missing or differs from the first node's; [] when every
    node has the same files with the same content. TREES is in inventory order."""
    out = []
    for name, tree in trees.items():
        if tree.error == "no such file":
            out.append(f"{name}: {tree.script} does not exist")
        elif tree.error == "too large":
            out.append(
                f"{name}: {tree.directory} holds more than {MAX_FILES} files or {MAX_BYTES >> 20} MiB, too much "
                "to compare; keep the code in a directory of its own (data elsewhere)"
            )
        elif tree.error:
            out.append(f"{name}: {tree.error}")
    if out:
        return out
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
                shown = ", ".join(paths[:SHOWN]) + (f" and {len(paths) - SHOWN} more" if len(paths) > SHOWN else "")
                parts.append(f"{label}: {shown}")
        if parts:
            out.append(f"{name}: {'; '.join(parts)} (compared with {reference_name}'s {reference.directory})")
    return out
