"""The file systems a job needs on a node, by what is free there (facts/filesystems.py reads them, NEEDS holds the
thresholds with their reasons): /tmp and $TMPDIR, /dev/shm, the home and cache directories, the data paths and the
shared directory; and what fills /dev/shm, named (files no live process holds open or maps)."""

from __future__ import annotations

from clustercheck.checks.registry import Finding, node_check, passed, skip
from clustercheck.facts.filesystems import (
    INODES_FAIL_BELOW,
    INODES_WARN_BELOW,
    NEED,
    Cause,
    Filesystem,
    Filesystems,
    Segment,
    size,
)
from clustercheck.facts.model import NodeFacts
from clustercheck.model import Status

# clustercheck's choice: a crashed job's NCCL segments are tens of MiB per rank; on a small /dev/shm, a tenth of it.
DEAD_WARN_FROM = 64 << 20
DEAD_WARN_SHARE = 0.1
SHOWN = 5  # segments named in a message


def problems(fs: Filesystem, found: Filesystems) -> list[tuple[Status, str, str]]:
    """What is wrong with FS for its need (NEEDS): (status, what, fix) for each."""
    need = NEED.get(fs.kind)
    if need is None:
        return []
    out = []
    what = f"{fs.path} ({need.name})" if need.name != fs.path else fs.path
    if fs.read_only and need.written:
        out.append((Status.FAIL, f"{what} is read-only", Cause(fs, "read-only").fix))
    if fs.noexec and need.executes:
        out.append(
            (Status.WARN, f"{what} is mounted noexec, where {need.uses} are loaded from", Cause(fs, "noexec").fix)
        )
    below = need.fail_below if fs.free_bytes < need.fail_below else need.warn_below
    if fs.free_bytes < below:
        status = Status.FAIL if below == need.fail_below else Status.WARN
        said = f"{what} has {size(fs.free_bytes)} free of {size(fs.total_bytes)}, less than {size(below)} ({need.uses})"
        if fs.kind == "shm" and found.dead:
            said += f"; {dead_text(found.dead)}"
        out.append((status, said, shm_fix(found.dead) if fs.kind == "shm" else Cause(fs, "full").fix))
    if fs.inodes and fs.free_inodes < INODES_WARN_BELOW:
        status = Status.FAIL if fs.free_inodes < INODES_FAIL_BELOW else Status.WARN
        out.append((status, f"{what} has {fs.free_inodes} free inodes of {fs.inodes}", Cause(fs, "full").fix))
    return out


def dead_text(dead: list[Segment]) -> str:
    total = sum(s.size_bytes for s in dead)
    named = ", ".join(f"{s.path} ({size(s.size_bytes)})" for s in sorted(dead, key=lambda s: -s.size_bytes)[:SHOWN])
    more = f" and {len(dead) - SHOWN} more" if len(dead) > SHOWN else ""
    return f"{len(dead)} file(s) no live process holds open or maps hold {size(total)}: {named}{more}"


def shm_fix(dead: list[Segment]) -> str:
    if not dead:
        return "Find what fills /dev/shm (ls -la /dev/shm) or enlarge it (its tmpfs size=; in containers --shm-size)."
    return (
        "Remove the segments no process owns (a crashed job's; rm /dev/shm/NAME, after checking with "
        "`fuser /dev/shm/NAME` that nothing holds it), or enlarge /dev/shm."
    )


@node_check(
    "fs.space",
    proves="/tmp (and $TMPDIR), /dev/shm, the home and cache directories, the data paths and the shared directory "
    "have free space and inodes for a job, and are writable (executable where code is loaded from them)",
    fix="Free space on that file system (du -xsh PATH/* | sort -h), or remount it as the job needs it.",
)
def fs_space(facts: NodeFacts) -> Finding:
    found = facts.filesystems
    if found is None:
        return skip("the first command read no file systems")
    seen: set[str] = set()
    listed = []
    for fs in found.paths:
        if fs.path in seen:
            continue
        seen.add(fs.path)
        listed += problems(fs, found)
    data = {
        f.path: {"kind": f.kind, "free_bytes": f.free_bytes, "total_bytes": f.total_bytes, "free_inodes": f.free_inodes}
        for f in found.paths
    }
    if not listed:
        free = ", ".join(f"{f.path} {size(f.free_bytes)}" for f in found.paths if f.path in seen)
        return passed(f"free: {free}", filesystems=data)
    worst = max(listed, key=lambda p: p[0] == Status.FAIL)
    status = Status.FAIL if any(p[0] == Status.FAIL for p in listed) else Status.WARN
    return Finding(status, "; ".join(p[1] for p in listed), worst[2], {"filesystems": data})


@node_check(
    "shm.segments",
    proves="/dev/shm holds no large files that no live process holds open or maps (a crashed job's NCCL or torch "
    "segments, which stay until removed or the node reboots): less than 64 MiB, or a tenth of /dev/shm",
    fix="Remove the files no process owns (rm /dev/shm/NAME after `fuser /dev/shm/NAME` shows nothing holds it).",
)
def shm_segments(facts: NodeFacts) -> Finding:
    found = facts.filesystems
    if found is None:
        return skip("the first command read no file systems")
    dead = found.dead
    total = sum(s.size_bytes for s in dead)
    data = {"dead": {s.path: s.size_bytes for s in dead}, "files": len(found.segments)}
    shm = found.of("shm")
    share = DEAD_WARN_SHARE * shm[0].total_bytes if shm else DEAD_WARN_FROM
    if dead and total >= min(DEAD_WARN_FROM, share):
        return Finding(Status.WARN, f"/dev/shm: {dead_text(dead)}", None, data)
    return passed(f"/dev/shm: {len(found.segments)} file(s), {size(total)} without a live owner", **data)
