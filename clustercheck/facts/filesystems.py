"""The file systems a job needs on a node: what remote/filesystems.sh printed, parsed (each path's free space and
inodes, whether it is read-only or noexec, and the /dev/shm segments no live process owns), the thresholds they are
judged by (NEEDS, data with its reason), and why a node-side program could not be written or started, from its
exit status and its words (`diagnose`). Pure logic, no I/O."""

from __future__ import annotations

import re
from dataclasses import dataclass

MIB = 1 << 20
GIB = 1 << 30

# remote/filesystems.sh's lines: fs, CLASS, PATH, `stat -f -c '%S %b %f %a %c %d'`, the mount point, its options.
FS = "fs"
SEGMENT = "shm"  # shm, SIZE, OWNER'S UID, PATH: a regular file in /dev/shm
UID = "uid"  # uid, UID: the user the script ran as
HELD = "held"  # held, PATH: a /dev/shm file some process holds open (/proc/*/fd) or maps (/proc/*/maps)


@dataclass(frozen=True)
class Filesystem:
    """One path a job needs, and the file system it is on."""

    kind: str  # which need (NEEDS): tmp, tmpdir, shm, home, cache, clustercheck, data, shared
    path: str
    total_bytes: int
    free_bytes: int  # what an unprivileged user may still write (statfs' f_bavail)
    inodes: int  # 0: a file system without an inode limit (btrfs reports none)
    free_inodes: int
    mount: str | None  # its mount point
    options: tuple[str, ...]  # that mount's options, as /proc/self/mounts gives them

    @property
    def read_only(self) -> bool:
        return "ro" in self.options

    @property
    def noexec(self) -> bool:
        return "noexec" in self.options

    @property
    def out_of_inodes(self) -> bool:
        return self.inodes > 0 and self.free_inodes == 0

    def holds(self, path: str) -> bool:
        """Whether PATH is this path or under it."""
        base = self.path.rstrip("/")
        return path == self.path or path.startswith(base + "/")

    @property
    def space(self) -> str:
        """Its size and what is free, in words: "16 MiB, 0 bytes free"."""
        return f"{size(self.total_bytes)}, {size(self.free_bytes)} free"


@dataclass(frozen=True)
class Segment:
    """A file in /dev/shm (NCCL's and torch's shared-memory segments live there)."""

    path: str
    size_bytes: int
    owned: bool  # some live process holds it open or maps it, or may (another user's, read by a user not root)


@dataclass(frozen=True)
class Filesystems:
    """What remote/filesystems.sh found on a node."""

    paths: tuple[Filesystem, ...]
    segments: tuple[Segment, ...] = ()

    def of(self, kind: str) -> list[Filesystem]:
        return [f for f in self.paths if f.kind == kind]

    @property
    def dead(self) -> list[Segment]:
        """The /dev/shm files no live process owns: what a crashed job left there."""
        return [s for s in self.segments if not s.owned]

    def holding(self, path: str) -> Filesystem | None:
        """The most specific of the paths that holds PATH."""
        found = [f for f in self.paths if f.holds(path)]
        return max(found, key=lambda f: len(f.path)) if found else None


def size(n: int) -> str:
    if n == 0:
        return "0 bytes"
    if n >= GIB:
        return f"{n / GIB:.1f} GiB"
    if n >= MIB:
        return f"{n / MIB:.0f} MiB"
    return f"{n / 1024:.0f} KiB"


def parse(text: str) -> Filesystems | None:
    """remote/filesystems.sh's lines in TEXT (other lines are left alone); None when it holds none of its `fs` lines."""
    paths: list[Filesystem] = []
    files: dict[str, tuple[int, str]] = {}  # path -> its size, its owner's uid
    held: set[str] = set()
    me = None
    for line in text.splitlines():
        fields = line.split("\t")
        if fields[0] == FS and len(fields) >= 4:
            found = _filesystem(fields)
            if found is not None:
                paths.append(found)
        elif fields[0] == SEGMENT and len(fields) == 4 and fields[1].isdigit():
            files[fields[3]] = (int(fields[1]), fields[2])
        elif fields[0] == HELD and len(fields) == 2:
            held.add(fields[1].removesuffix(" (deleted)"))
        elif fields[0] == UID and len(fields) == 2:
            me = fields[1]
    if not paths:
        return None
    # A user other than root reads only its own processes: another user's file may have an owner it cannot see.
    unseen = {p for p, (_, uid) in files.items() if me != "0" and uid != me}
    segments = tuple(Segment(p, n, p in held or p in unseen) for p, (n, _) in sorted(files.items()))
    return Filesystems(tuple(paths), segments)


def _filesystem(fields: list[str]) -> Filesystem | None:
    numbers = fields[3].split()
    if len(numbers) != 6 or not all(n.isdigit() for n in numbers):
        return None
    block, blocks, _free, available, inodes, free_inodes = (int(n) for n in numbers)
    mount = fields[4] if len(fields) > 4 and fields[4] else None
    options = tuple(fields[5].split(",")) if len(fields) > 5 and fields[5] else ()
    return Filesystem(fields[1], fields[2], block * blocks, block * available, inodes, free_inodes, mount, options)


@dataclass(frozen=True)
class Need:
    """What a job needs of one kind of path, and why: FAIL below FAIL_BELOW bytes free, WARN below WARN_BELOW; a
    read-only one fails where it is WRITTEN, a noexec one where code is loaded from it (EXECUTES)."""

    kind: str
    name: str  # in words
    warn_below: int
    fail_below: int
    written: bool
    executes: bool
    uses: str  # what a job keeps there, in a few words (the messages say it)
    why: str  # the reason for the figures, and their source where one gives them


# The figures are clustercheck's choice where no source gives one: enough for what the reason names, with room.
NEEDS = (
    Need(
        "tmp",
        "/tmp",
        1 * GIB,
        64 * MIB,
        True,
        True,
        "clustercheck's programs, torch.compile's kernels",
        "clustercheck's run directory (its programs, about 1 MiB, and their outputs) and torch.compile's caches: "
        "TorchInductor writes its compiled kernels under /tmp/torchinductor_<user> and loads them from there "
        "(torch's documentation, TORCHINDUCTOR_CACHE_DIR), so noexec breaks them too",
    ),
    Need(
        "tmpdir",
        "$TMPDIR",
        1 * GIB,
        64 * MIB,
        True,
        True,
        "torch.compile's kernels, Python's temporary files",
        "what /tmp holds, where $TMPDIR moves it (Python's tempfile, TorchInductor's default cache directory)",
    ),
    Need(
        "shm",
        "/dev/shm",
        512 * MIB,
        256 * MIB,
        True,
        False,
        "NCCL's shared-memory segments, DataLoader workers' tensors",
        "NCCL's shared-memory transport and DataLoader workers' tensors: NCCL fails creating its segments "
        "(ncclShmOpen) in Docker's default 64 MiB, and PyTorch runs its own CI containers with --shm-size=2gb; the "
        "figures are shm.size's (a FAIL below 256 MiB), and half the 1 GiB it asks for",
    ),
    Need(
        "home",
        "the home directory",
        1 * GIB,
        64 * MIB,
        True,
        True,
        "Triton's kernel cache, downloads, the login's own files",
        "Triton's kernel cache (~/.triton/cache, loaded from there), pip's and torch hub's downloads, shell history; "
        "a full home directory also breaks an SSH login's own writes",
    ),
    Need(
        "cache",
        "the cache directory",
        1 * GIB,
        64 * MIB,
        True,
        False,
        "torch hub's and Hugging Face's downloads",
        "$XDG_CACHE_HOME (~/.cache): torch hub's models, Hugging Face's datasets and models, pip",
    ),
    Need(
        "clustercheck",
        "clustercheck's cache directory",
        16 * MIB,
        1 * MIB,
        True,
        False,
        "node-health's record of torch's import",
        "node-health keeps torch's last import there (a few KiB): clustercheck's choice, room for it",
    ),
    Need("data", "a data path", 0, 0, False, False, "the job's data", "read by the job (--data-path): no figure"),
    Need(
        "shared",
        "the shared directory",
        10 * GIB,
        1 * GIB,
        True,
        False,
        "the checkpoint",
        "the checkpoint (--shared-dir): a model's weights with its optimizer's state, several times the weights",
    ),
)
NEED = {n.kind: n for n in NEEDS}
INODES_FAIL_BELOW = 1000  # clustercheck's choice: a compile cache writes a directory and files per kernel
INODES_WARN_BELOW = 10000


# A write that failed, as programs say it: strerror's text and Python's OSError (errno 28, 122, 30).
WRITE_ERRORS = {
    "No space left on device": "full",
    "[Errno 28]": "full",
    "Disk quota exceeded": "over quota",
    "[Errno 122]": "over quota",
    "Read-only file system": "read-only",
    "[Errno 30]": "read-only",
}
CANNOT_EXECUTE = ("Permission denied", "[Errno 13]")  # with exit 126: a program on a noexec file system
PATH_IN_TEXT = re.compile(r"(/[^\s:'\"()\[\],]+)")


@dataclass(frozen=True)
class Cause:
    """A file system that stopped a program: which, and what is wrong with it."""

    filesystem: Filesystem
    problem: str  # full, out of inodes, over quota, read-only, noexec

    @property
    def text(self) -> str:
        where = self.filesystem.path
        fs = self.filesystem
        if self.problem == "full":
            return f"{where} is full ({fs.space})"
        if self.problem == "out of inodes":
            return f"{where} has no free inodes ({fs.inodes} in all; {fs.space})"
        if self.problem == "over quota":
            return f"{where} is over the user's quota ({fs.space})"
        return f"{where} is {self.problem} (mounted {','.join(fs.options[:4])} on {fs.mount or where})"

    @property
    def fix(self) -> str:
        where = self.filesystem.mount or self.filesystem.path
        if self.problem in ("full", "out of inodes", "over quota"):
            return f"free it: see what fills it with `du -xsh {where}/* | sort -h` and remove what no job needs"
        if self.problem == "read-only":
            return f"find why it is read-only (dmesg: a file system error remounts it so) and remount {where} rw"
        return f"mount {where} without noexec (its /etc/fstab line or the unit that mounts it)"


def blocking(fs: Filesystem) -> str | None:
    """What stops any write to FS, if anything."""
    if fs.free_bytes == 0:
        return "full"
    if fs.out_of_inodes:
        return "out of inodes"
    if fs.read_only:
        return "read-only"
    return None


def diagnose(found: Filesystems | None, said: str, exit_status: int | None, needs: str, *, wrote: bool) -> Cause | None:
    """Why a program on a node failed, when a file system it needed is why: FOUND, what remote/filesystems.sh read
    there; SAID, its standard error and output; NEEDS, the path it is written to and runs from (the run's work
    directory). WROTE: it failed writing (the checked upload's exit), so the file system NEEDS is on is to blame if
    nothing else is. The file systems its words name come first, then the one NEEDS is on. None when no file
    system explains it: nothing else is blamed."""
    if found is None:
        return None
    named = [fs for fs in (found.holding(p) for p in PATH_IN_TEXT.findall(said)) if fs is not None]
    own = found.holding(needs)
    candidates = list(dict.fromkeys([*named, *([own] if own else [])]))
    errors = [problem for text, problem in WRITE_ERRORS.items() if text in said]
    if exit_status == 126 and any(text in said for text in CANNOT_EXECUTE):
        for fs in candidates:
            if fs.noexec:
                return Cause(fs, "noexec")
    if not errors and not wrote:
        return None
    for fs in candidates:
        problem = blocking(fs)
        if problem is not None and (not errors or _agrees(problem, errors)):
            return Cause(fs, problem)
    if "over quota" in errors and candidates:
        return Cause(candidates[0], "over quota")
    if errors:  # the words say a write failed, but not where: any file system that stops writes
        for fs in found.paths:
            problem = blocking(fs)
            if problem is not None and _agrees(problem, errors):
                return Cause(fs, problem)
    return None


def _agrees(problem: str, errors: list[str]) -> bool:
    """Whether a file system's PROBLEM is what the program's words (ERRORS) said: ENOSPC is space or inodes."""
    return problem in errors or (problem == "out of inodes" and "full" in errors)
