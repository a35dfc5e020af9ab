"""The same code on every node, the node's side (standard library only, Python 3.8+): the script's directory hashed,
and the record of the launches that ran from it (~/.local/state/clustercheck/code/), so that what a run wrote beside
the script is left out of a later comparison. The controller (launcher/sameness.py) sends this file with `python -c`
(nodeprogram.source) and compares the answers; `code_files` is the one definition of what counts as the code, which
--sync's archive uses too.

argv: hash SCRIPT CWD MAX_FILES MAX_BYTES SKIP_PATHS(JSON) | begin DIRECTORY JOB DETACHED (stdin: the files compared
and the outputs left out, JSON) | end DIRECTORY JOB. hash prints one JSON document.
"""

import fnmatch
import hashlib
import json
import os
import sys
import tempfile
import time

SKIP_DIRS = ("__pycache__", ".git", ".venv", "venv", "clustercheck-runs")
SKIP_SUFFIXES = (".pyc",)
KEPT_LAUNCHES = 20  # launches remembered per directory on a node (their outputs are remembered beyond that)


def gitignore_rules(top):
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


def gitignored(path, is_dir, rules):
    """Whether PATH (relative, with /) is ignored by RULES: the last pattern that matches decides, as in git."""
    ignored = False
    for negated, directories_only, anchored, pattern in rules:
        if directories_only and not is_dir:
            continue
        if fnmatch.fnmatchcase(path if anchored else path.rsplit("/", 1)[-1], pattern):
            ignored = not negated
    return ignored


def code_files(top, skip_paths=()):
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
    windows = [
        (run["started"] - 0.05, ended(run, following), set(run["files"]))
        for run, following in zip(runs, nexts)  # noqa: B905 (Python 3.8 on the node: no strict=)
    ]
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
            return {"script": path, "error": f"unreadable: {exc}"}
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


def main(argv):
    if argv[1] == "hash":
        print(json.dumps(hash_tree(argv[2], argv[3], int(argv[4]), int(argv[5]), json.loads(argv[6]))))
    elif argv[1] == "begin":
        begin(argv[2], argv[3], argv[4] == "1")
    else:
        end(argv[2], argv[3])


if __name__ == "__main__":
    main(sys.argv)
