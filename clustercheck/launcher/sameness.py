"""The same code on every node: the script's directory hashed on each node, and the nodes compared (pure logic;
the hashing runs on the node as a short program of the standard library, Python 3.8+).

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

import fnmatch
import inspect
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field

from clustercheck.remote.probing import NO_WORKING_DIRECTORY
from clustercheck.stages import nodeprogram

MAX_FILES = 5000
MAX_BYTES = 512 * 1024 * 1024
SHOWN = 3  # differing files named per node
SKIP_DIRS = ("__pycache__", ".git", ".venv", "venv", "clustercheck-runs")
SKIP_SUFFIXES = (".pyc",)
EXCLUDED = "`.venv`, `venv`, `.git`, `__pycache__`, `*.pyc`, `clustercheck-runs`, the .gitignore's patterns"
KEPT_LAUNCHES = 20  # launches remembered per directory on a node (their outputs are remembered beyond that)


def gitignore_rules(top: str) -> list:
    """The patterns of TOP/.gitignore as (negated, directories only, anchored, pattern), in order."""
    rules = []
    try:
        with open(os.path.join(top, ".gitignore"), encoding="utf-8", errors="replace") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return rules
    for line in lines:
        line = line.rstrip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        if negated:
            line = line[1:]
        directories_only = line.endswith("/")
        line = line.rstrip("/")
        if line.startswith("**/"):
            line = line[3:]
        anchored = "/" in line  # a slash at the start or in the middle: relative to the .gitignore's directory
        if line:
            rules.append((negated, directories_only, anchored, line.lstrip("/")))
    return rules


def gitignored(path: str, is_dir: bool, rules: list) -> bool:
    """Whether PATH (relative, with /) is ignored by RULES: the last pattern that matches decides, as in git."""
    ignored = False
    for negated, directories_only, anchored, pattern in rules:
        if directories_only and not is_dir:
            continue
        if fnmatch.fnmatchcase(path if anchored else path.rsplit("/", 1)[-1], pattern):
            ignored = not negated
    return ignored


def code_files(top: str, skip_paths: tuple = ()) -> Iterator:
    """(relative path, full path) of every file of the code under TOP, sorted; SKIP_PATHS are left out too."""
    rules = gitignore_rules(top)
    skipped = {os.path.realpath(p) for p in skip_paths}
    for root, dirs, names in os.walk(top):
        prefix = "" if root == top else os.path.relpath(root, top).replace(os.sep, "/") + "/"
        dirs[:] = sorted(
            d
            for d in dirs
            if d not in SKIP_DIRS
            and not gitignored(prefix + d, True, rules)
            and os.path.realpath(os.path.join(root, d)) not in skipped
        )
        for name in sorted(names):
            full = os.path.join(root, name)
            if name.endswith(SKIP_SUFFIXES) or gitignored(prefix + name, False, rules) or not os.path.isfile(full):
                continue
            if os.path.realpath(full) not in skipped:
                yield prefix + name, full


# argv: hash SCRIPT CWD MAX_FILES MAX_BYTES SKIP_PATHS(JSON) | begin DIRECTORY JOB DETACHED (stdin: the files
# compared and the outputs left out, JSON) | end DIRECTORY JOB. hash prints one JSON document.
_MAIN = r"""
import hashlib, json, os, sys, tempfile, time

STATE = os.path.expanduser("~/.local/state/clustercheck")


def record_path(top):
    return os.path.join(STATE, "code", hashlib.sha256(top.encode()).hexdigest()[:16] + ".json")


def load(top):
    try:
        with open(record_path(top)) as fh:
            record = json.load(fh)
        if record.get("directory") == top:
            return record
    except (OSError, ValueError):
        pass
    return {"directory": top, "outputs": {}, "launches": []}


def save(record):
    path = record_path(record["directory"])
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, partial = tempfile.mkstemp(dir=os.path.dirname(path))
    with os.fdopen(fd, "w") as fh:
        json.dump(record, fh)
    os.replace(partial, path)


def ended(launch, following):
    # When the launch's job ended on this node: recorded by a foreground launch (one whose end was not recorded,
    # its control machine gone, ended by the next launch); for a detached job, when it exited (exit-status) or
    # was stopped (stopped), and a job directory removed leaves no window; a job still running runs until now.
    if launch.get("ended"):
        return launch["ended"]
    if launch.get("detached"):
        directory = os.path.join(STATE, "jobs", launch["job"])
        if not os.path.isdir(directory):
            return launch["started"]
        for name in ("exit-status", "stopped"):
            try:
                return os.stat(os.path.join(directory, name)).st_mtime
            except OSError:
                pass
        return time.time()
    return following


def hash_tree(script, cwd, max_files, max_bytes, skip_paths):
    base = os.path.expanduser(cwd) if cwd else os.getcwd()
    path = os.path.normpath(os.path.join(base, os.path.expanduser(script)))
    if not os.path.isfile(path):
        return {"script": path, "error": "no such file"}
    top = os.path.dirname(path)
    record = load(top)
    runs = record["launches"]
    nexts = [run["started"] for run in runs[1:]] + [time.time()]
    # A file's mtime comes from the kernel's coarse clock, up to a tick behind time.time(): a little slack at the
    # start; none at the end, where a file the user writes the moment after a job ended is code.
    windows = [(run["started"] - 0.05, ended(run, following), set(run["files"])) for run, following in zip(runs, nexts)]
    files, outputs, total = {}, {}, 0
    for relative, full in code_files(top, tuple(skip_paths)):
        mtime = os.stat(full).st_mtime
        if record["outputs"].get(relative) == mtime or any(
            start <= mtime <= end and relative not in code for start, end, code in windows
        ):
            outputs[relative] = mtime
            continue
        total += os.path.getsize(full)
        if len(files) >= max_files or total > max_bytes:
            return {"script": path, "error": "too large", "directory": top}
        digest = hashlib.sha256()
        try:
            with open(full, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    digest.update(block)
        except OSError as exc:
            return {"script": path, "error": "unreadable: %s" % exc}
        files[relative] = digest.hexdigest()
    return {"script": path, "directory": top, "files": files, "outputs": outputs}


def begin(top, job, detached):
    given = json.load(sys.stdin)
    record = load(top)
    record["outputs"] = given["outputs"]
    launch = {"job": job, "started": time.time(), "ended": None, "detached": detached, "files": given["files"]}
    record["launches"] = (record["launches"] + [launch])[-KEPT_LAUNCHES:]
    save(record)


def end(top, job):
    record = load(top)
    for launch in record["launches"]:
        if launch["job"] == job and not launch.get("ended"):
            launch["ended"] = time.time()
    save(record)


if sys.argv[1] == "hash":
    print(json.dumps(hash_tree(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), json.loads(sys.argv[6]))))
elif sys.argv[1] == "begin":
    begin(sys.argv[2], sys.argv[3], sys.argv[4] == "1")
else:
    end(sys.argv[2], sys.argv[3])
"""


def _program() -> str:
    """The node-side program: the code's definition above, the constants it reads, then _MAIN."""
    constants = "".join(f"{name} = {globals()[name]!r}\n" for name in ("SKIP_DIRS", "SKIP_SUFFIXES", "KEPT_LAUNCHES"))
    functions = "\n\n".join(inspect.getsource(f) for f in (gitignore_rules, gitignored, code_files))
    head = f"from __future__ import annotations\n{NO_WORKING_DIRECTORY}import fnmatch, os\n"
    return f"{head}{constants}\n\n{functions}\n{_MAIN}"


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
    return [python, "-c", _program(), "hash", script, cwd or "", str(MAX_FILES), str(MAX_BYTES), json.dumps(skip_paths)]


def begin_command(python: str, tree: Tree, job: str, detached: bool) -> tuple[list[str], str]:
    """(argv, stdin) recording on a node, just before JOB starts there, the code it runs and what was left out."""
    given = json.dumps({"files": sorted(tree.files), "outputs": tree.outputs})
    return [python, "-c", _program(), "begin", tree.directory, job, "1" if detached else "0"], given


def end_command(python: str, directory: str, job: str) -> list[str]:
    """Recording on a node that the foreground JOB from DIRECTORY ended."""
    return [python, "-c", _program(), "end", directory, job]


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
