"""The job's code on the nodes: uploaded with --sync, or compared (the script's directory hashed on every node and
found the same); and, while a job runs from a compared directory, the record on each node that says so."""

from __future__ import annotations

import io
import tarfile
import threading
from pathlib import Path

from clustercheck.launcher import sameness
from clustercheck.launcher.job import Echo, LaunchOptions, NotStarted, each
from clustercheck.reach import Reach
from clustercheck.stages import Member, nodeprogram
from clustercheck.stages.launch import LaunchError
from clustercheck.transport import put


def sync_script(sync: Path, script: str) -> str:
    """The script's path inside --sync DIR, relative to it (the job runs in the synced copy)."""
    base = sync.resolve()
    path = Path(script).expanduser()
    path = (path if path.is_absolute() else base / path).resolve()
    try:
        relative = path.relative_to(base)
    except ValueError:
        raise LaunchError(f"{script}: not inside --sync {sync}") from None
    if not path.is_file():
        raise LaunchError(f"{script}: no such file in --sync {sync}")
    return str(relative)


def archive(directory: Path, skip_paths: tuple[str, ...] = ()) -> bytes:
    """The code under DIRECTORY as a tar.gz: what the same-code check compares (sameness.code_files), so neither
    environments, caches, version control nor run directories are uploaded."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for relative, full in sameness.local_files(str(directory), skip_paths):
            tar.add(full, arcname=relative, recursive=False)
    return buffer.getvalue()


def upload(
    reach: Reach, members: list[Member], sync: Path, options: LaunchOptions, say: Echo
) -> tuple[str, str | None, str | None]:
    """SYNC (--sync DIR) copied to every node (and unpacked there, for a foreground job). Returns (script, cwd,
    archive path on the nodes)."""
    o = options
    script = sync_script(sync, o.command.script) if not o.command.is_module else o.command.script
    data = archive(sync, (str(o.run_dir.resolve()),))

    def one(m: Member) -> None:
        put(m.transport, data, f"{m.transport.workdir.rstrip('/')}/code.tgz")
        if not o.detach:
            target = f"{m.transport.workdir.rstrip('/')}/code"
            got = nodeprogram.run(
                m.transport, ["sh", "-c", f"mkdir -p {target} && tar xzf {target}.tgz -C {target}"], timeout=300
            )
            if not got.ok:
                raise NotStarted(f"{m.name}: could not unpack the synced code: {got.cause()}")

    each(reach, members, one, "copying --sync")
    say(f"synced {sync} ({len(data) >> 10} KiB) to {len(members)} node(s)")
    if o.detach:
        return script, "@code", "code.tgz"
    return script, f"{members[0].transport.workdir.rstrip('/')}/code", None


def compare(reach: Reach, members: list[Member], options: LaunchOptions, say: Echo) -> dict[str, sameness.Tree]:
    """The script's directory hashed on every node; refuses the launch unless it is the same everywhere."""
    o = options
    trees: dict[str, sameness.Tree] = {}
    skip = (str(o.run_dir.resolve()),)  # the launch's own run directory, where the control machine is a node

    def hash_one(m: Member) -> None:
        argv = sameness.command(m.facts.python, o.command.script, o.chdir, skip)
        got = nodeprogram.call(m.transport, argv, program="the code's hashing", timeout=300)
        failed = got.failure
        trees[m.name] = (
            sameness.tree(got.value) if failed is None else sameness.Tree(error=f"hashing failed: {failed.cause}")
        )

    each(reach, members, hash_one, "comparing the code")
    trees = {m.name: trees[m.name] for m in members}
    unusable = sameness.unusable(trees)
    if unusable:
        raise NotStarted("the script's directory could not be compared between the nodes: " + "; ".join(unusable))
    problems = sameness.problems(trees)
    if problems:
        raise NotStarted(
            "the script or its directory is not the same on every node: "
            + "; ".join(problems)
            + " (copy the same code to every node, or pass --sync DIR to upload it)"
        )
    first = trees[members[0].name]
    say(f"{first.script}: the same {len(first.files)} file(s) on every node")
    for m in members:
        if trees[m.name].outputs:
            written = sameness.shown(sorted(trees[m.name].outputs))
            say(f"  not compared on {m.name}, written by earlier launches from there: {written}")
    return trees


class RunningRecords:
    """On every node, the record that this launch's job runs from the compared directory: what appears there
    while it runs is its output, not compared by later launches (sameness)."""

    def __init__(self, reach: Reach) -> None:
        self.reach = reach
        self.trees: dict[str, sameness.Tree] = {}  # the script's directory on each node, when it was compared
        self._recorded: list[Member] = []  # the nodes where this launch was recorded
        self._lock = threading.Lock()

    def start(self, members: list[Member], job_id: str, in_unit: bool) -> None:
        if not self.trees:
            return

        def record(m: Member) -> None:
            argv, given = sameness.begin_command(m.facts.python, self.trees[m.name], job_id, in_unit)
            if nodeprogram.run(m.transport, argv, timeout=60, stdin=given).ok:
                with self._lock:
                    self._recorded.append(m)

        self.reach.each(record, members, timeout=90, name=lambda m: m.name)

    def end(self, job_id: str) -> None:
        def ended(m: Member) -> None:
            directory = self.trees[m.name].directory
            nodeprogram.run(m.transport, sameness.end_command(m.facts.python, directory, job_id), timeout=30)

        self.reach.each(ended, self._recorded, timeout=45, name=lambda m: m.name)
        self._recorded = []
