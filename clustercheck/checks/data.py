"""Judge the shared directory and the data paths as every node saw them (pure logic, no I/O).

The stage (stages/data.py) runs `clustercheck_remote.data` on every node: for --shared-dir, one node writes a token
and every other node reads it back; for each --data-path, every node reports its file count, total size and a hash
of a sample of its files. A node that differs from the others is named with what differs.
"""

from __future__ import annotations

from collections import Counter

from clustercheck.checks.registry import declare, emit
from clustercheck.model import CheckResult, Status

STAGE = "data"
SHARED_DIR = "data.shared_dir"
PATHS = "data.paths"
declare(
    SHARED_DIR,
    stage=STAGE,
    scope="cluster",
    proves="--shared-dir is one filesystem on every node (a token written on the first node is read on all the "
    "others), writable, with its free space reported",
    fix="Mount the same shared filesystem (NFS, Lustre, ...) at this path on every node, writable for the training "
    "user; a node that reads no token has a local directory there (the mount is missing).",
)
declare(
    PATHS,
    stage=STAGE,
    scope="cluster",
    proves="every --data-path (or clustercheck_data_paths) exists on every node with the same content: file count, "
    "total size and a hash of a sample of its files",
    fix="Copy the dataset to the node that differs (rsync -a from a node that agrees), or mount the shared copy "
    "there, so that every rank reads the same data.",
)


def _size(n: int | None) -> str:
    if n is None:
        return "?"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"  # unreachable


def evaluate_shared(
    path: str, writer: str, answers: dict[str, dict], errors: dict[str, str], token: str
) -> CheckResult:
    """ANSWERS: node -> what `data shared` said there (WRITER wrote TOKEN, the others read it); ERRORS: node -> why
    it did not answer."""
    problems = [f"{node}: {why}" for node, why in sorted(errors.items())]
    for node, answer in answers.items():
        if answer.get("error"):
            problems.append(f"{node}: {path} {answer['error']}")
    mine = answers.get(writer)
    if mine is not None and not mine.get("error"):
        readers = [n for n in answers if n != writer and not answers[n].get("error")]
        unseen = sorted(n for n in readers if answers[n].get("token") != token)
        if not mine.get("wrote"):
            problems.append(f"{writer}: could not write the token into {path}")
        elif unseen:
            problems.append(
                f"{', '.join(unseen)} {'does' if len(unseen) == 1 else 'do'} not see the token {writer} wrote into "
                f"{path}: not the same filesystem as on {writer}"
            )
    free = {n: a.get("free_bytes") for n, a in answers.items() if a.get("free_bytes") is not None}
    data = {"path": path, "writer": writer, "free_bytes": free, "problems": problems}
    if problems:
        return emit(SHARED_DIR, Status.FAIL, f"--shared-dir {path}: " + "; ".join(problems), data=data)
    least = min(free.values()) if free else None
    return emit(
        SHARED_DIR,
        Status.PASS,
        f"--shared-dir {path} is one writable filesystem on all {len(answers)} nodes (a token written on {writer} "
        f"read on every other node), {_size(least)} free",
        data=data,
    )


FIELDS = (("files", "files"), ("bytes", "total size"), ("sample_hash", "sample hash"))


def _show(field: str, value) -> str:
    if field == "bytes":
        return _size(value)
    return str(value)


def evaluate_paths(answers: dict[str, dict], errors: dict[str, str], order: list[str]) -> CheckResult:
    """ANSWERS: node -> what `data paths` said there ({"paths": [summary, ...]}); ORDER: the nodes in inventory order
    (the first one breaks ties)."""
    problems = [f"{node}: {why}" for node, why in sorted(errors.items())]
    by_path: dict[str, dict[str, dict]] = {}
    for node in order:
        for summary in answers.get(node, {}).get("paths", []):
            by_path.setdefault(summary["path"], {})[node] = summary
    data: dict = {"paths": {}}
    for path, seen in by_path.items():
        missing = [n for n in order if n in seen and seen[n].get("error")]
        for error in sorted({seen[n]["error"] for n in missing}):
            problems.append(f"{path} {error} on {', '.join(n for n in missing if seen[n]['error'] == error)}")
        present = {n: s for n, s in seen.items() if not s.get("error")}
        key = {n: tuple(s.get(f) for f, _ in FIELDS) for n, s in present.items()}
        common = Counter(key.values())
        usual = None
        if common:
            top = max(common.values())
            usual = next(key[n] for n in order if n in key and common[key[n]] == top)
        odd = [n for n in order if n in key and key[n] != usual]
        expected = dict(zip([f for f, _ in FIELDS], usual or (), strict=False))
        for node in odd:
            what = [
                f"{label} {_show(f, present[node].get(f))} (others {_show(f, expected.get(f))})"
                for f, label in FIELDS
                if present[node].get(f) != expected.get(f)
            ]
            problems.append(f"{path} differs on {node}: " + ", ".join(what))
        first = present.get(next((n for n in order if n in key and key[n] == usual), ""), {})
        data["paths"][path] = {
            "files": first.get("files"),
            "bytes": first.get("bytes"),
            "sample_hash": first.get("sample_hash"),
            "differing_nodes": odd,
            "missing_on": missing,
        }
    if problems:
        return emit(PATHS, Status.FAIL, "data paths: " + "; ".join(problems), data=data)
    described = ", ".join(
        f"{p} ({d['files']} files, {_size(d['bytes'])}, sample {d['sample_hash']})" for p, d in data["paths"].items()
    )
    return emit(PATHS, Status.PASS, f"the same on all {len(order)} nodes: {described}", data=data)
