"""The shared directory and the data paths, as one node sees them (standard library only; Python 3.8+).

    data shared --dir D --name N [--write TOKEN | --read] [--remove]
        whether D is a writable directory and its free space; --write puts TOKEN into D/.N, --read reads it back
        (the controller writes on one node and reads on all others), --remove deletes it
    data paths --path P [--path P ...]
        for each path: whether it exists, its file count, total size, and a hash of a sample of its files

One JSON object on stdout; a problem is recorded as an "error" in the answer, never raised.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import socket
import sys

SAMPLE_FILES = 32  # files whose content is hashed, spread evenly over the sorted file list
SAMPLE_BYTES = 1 << 20  # read from the start of each sampled file


def free_space(path: str) -> dict:
    st = os.statvfs(path)
    return {"free_bytes": st.f_bavail * st.f_frsize, "total_bytes": st.f_blocks * st.f_frsize}


def shared(args) -> dict:
    out = {"dir": args.dir}
    if not os.path.isdir(args.dir):
        out["error"] = "does not exist" if not os.path.exists(args.dir) else "is not a directory"
        return out
    out.update(free_space(args.dir))
    probe = os.path.join(args.dir, f".{args.name}-{socket.gethostname()}-{os.getpid()}")
    try:
        with open(probe, "w") as fh:
            fh.write("clustercheck write test\n")
        os.remove(probe)
        out["writable"] = True
    except OSError as exc:
        out["writable"] = False
        out["error"] = f"not writable: {exc.strerror or exc}"
    token_path = os.path.join(args.dir, f".{args.name}")
    if args.write is not None and out.get("writable"):
        try:
            with open(token_path, "w") as fh:
                fh.write(args.write)
                fh.flush()
                os.fsync(fh.fileno())
            out["wrote"] = True
        except OSError as exc:
            out["error"] = f"cannot write {token_path}: {exc.strerror or exc}"
    if args.read:
        try:
            with open(token_path) as fh:
                out["token"] = fh.read()
        except OSError as exc:
            out["token"] = None
            out["read_error"] = exc.strerror or str(exc)
    if args.remove:
        with contextlib.suppress(OSError):
            os.remove(token_path)
    return out


def files_of(path: str) -> list:
    """(relative path, size) of every regular file under PATH (PATH itself when it is a file), sorted."""
    if os.path.isfile(path):
        return [(os.path.basename(path), os.path.getsize(path))]
    found = []
    for root, dirs, names in os.walk(path):
        dirs.sort()
        for name in names:
            full = os.path.join(root, name)
            try:
                if os.path.isfile(full):
                    found.append((os.path.relpath(full, path), os.path.getsize(full)))
            except OSError:
                continue
    return sorted(found)


def sample(files: list, count: int = SAMPLE_FILES) -> list:
    """COUNT files spread evenly over FILES (all of them when there are fewer): the same choice on every node
    that has the same file list."""
    if len(files) <= count:
        return list(files)
    step = len(files) / count
    return [files[int(i * step)] for i in range(count)]


def summary(path: str) -> dict:
    out = {"path": path}
    if not os.path.exists(path):
        out["error"] = "does not exist"
        return out
    files = files_of(path)
    listing = hashlib.sha256()
    for rel, size in files:
        listing.update(f"{rel}\0{size}\n".encode())
    digest = hashlib.sha256()
    chosen = sample(files)
    for rel, size in chosen:
        digest.update(f"{rel}\0{size}\n".encode())
        full = path if os.path.isfile(path) else os.path.join(path, rel)
        try:
            with open(full, "rb") as fh:
                digest.update(fh.read(SAMPLE_BYTES))
        except OSError as exc:
            digest.update(f"unreadable: {exc.strerror}".encode())
    out.update(
        kind="file" if os.path.isfile(path) else "directory",
        files=len(files),
        bytes=sum(size for _, size in files),
        listing_hash=listing.hexdigest()[:16],
        sample_hash=digest.hexdigest()[:16],
        sampled=len(chosen),
    )
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="what", required=True)
    p_shared = sub.add_parser("shared")
    p_shared.add_argument("--dir", required=True)
    p_shared.add_argument("--name", required=True)
    p_shared.add_argument("--write", default=None)
    p_shared.add_argument("--read", action="store_true")
    p_shared.add_argument("--remove", action="store_true")
    p_paths = sub.add_parser("paths")
    p_paths.add_argument("--path", action="append", required=True)
    args = parser.parse_args(argv)
    answer = shared(args) if args.what == "shared" else {"paths": [summary(p) for p in args.path]}
    answer["host"] = socket.gethostname()
    sys.stdout.write(json.dumps(answer) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
