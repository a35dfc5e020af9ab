"""The node-side package (clustercheck/remote/), bundled as one zip application and uploaded once per node.

On the node it runs as `PYTHON WORKDIR/clustercheck-remote.pyz PROGRAM ARGS...` (programs: facts, netprobe, gpubench,
gpuburn, collectives, ddp); torchrun starts the torch workers the same way, with the zip as its script.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import io
import shlex
import threading
import zipfile
from importlib import resources
from pathlib import Path

from clustercheck.remote.probing import NO_WORKING_DIRECTORY
from clustercheck.transport import (
    RECORD_UNTIL,
    UNTIL_MARKER,
    UPLOAD_FAILED,
    WRITE_CHECKED,
    CommandResult,
    Transport,
    put,
)

PACKAGE = "clustercheck_remote"  # its name on the node, so it never shadows an installed clustercheck
FILE = "clustercheck-remote.pyz"
PROGRAMS = ("facts", "netprobe", "data", "gpubench", "gpuburn", "collectives", "ddp", "lightning")

_lock = threading.Lock()
_uploaded: set[tuple[str, str]] = set()


@functools.cache
def bundle() -> bytes:
    """The zip application: the package's modules under clustercheck_remote/, and its __main__.py at the top."""
    source = resources.files("clustercheck.remote")
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for entry in sorted(source.iterdir(), key=lambda e: e.name):
            if entry.name.endswith(".py"):
                text = entry.read_text()
                archive.writestr(zipfile.ZipInfo(f"{PACKAGE}/{entry.name}", (2020, 1, 1, 0, 0, 0)), text)
                if entry.name == "__main__.py":
                    archive.writestr(zipfile.ZipInfo("__main__.py", (2020, 1, 1, 0, 0, 0)), text)
    return buffer.getvalue()


@functools.cache
def encoded() -> str:
    """The bundle in base64, as INSTALL reads it from standard input (text through every transport)."""
    return base64.b64encode(bundle()).decode()


@functools.cache
def digest() -> str:
    return hashlib.sha256(bundle()).hexdigest()


# sh -c INSTALL sh WORKDIR SHA256 COMMAND...: the bundle (base64, on standard input) written into WORKDIR (made,
# mode 700) as every file is (transport.WRITE_CHECKED: whole or not at all, checked against SHA256); then COMMAND in
# the same process. The upload and the first program run in one round trip instead of two. The run's deadline is
# recorded in the new directory, as every later command does (transport.RECORD_UNTIL).
INSTALL = (
    f'd=$1; sum=$2; shift 2; f="$d/{FILE}"; '
    f'mkdir -p -m 700 "$d" || exit {UPLOAD_FAILED}; '
    f'[ -z "${UNTIL_MARKER}" ] || sh -c {shlex.quote(RECORD_UNTIL)} sh "$d" "${UNTIL_MARKER}"; '
    f'{WRITE_CHECKED}; exec "$@"'
)


@functools.cache
def source(module: str) -> str:
    """The text of MODULE (remote/MODULE.py), a program of the standard library alone, as `python -c` runs it on a
    node: without the working directory on sys.path (probing.NO_WORKING_DIRECTORY), so a user's file there never
    shadows a module it imports. For the short programs that run without the bundle (nodeprogram.call)."""
    return NO_WORKING_DIRECTORY + resources.files("clustercheck.remote").joinpath(f"{module}.py").read_text()


@functools.cache
def script(name: str) -> str:
    """The text of the shell script remote/NAME.sh, as `sh -c` runs it on a node: for what must run where no Python
    is known yet (a detached job's unit, the jobs on a node)."""
    return resources.files("clustercheck.remote").joinpath(f"{name}.sh").read_text()


def path(workdir: str) -> str:
    return f"{workdir.rstrip('/')}/{FILE}"


def write(directory: str | Path) -> str:
    """Write the bundle into DIRECTORY (a local node's run directory in the tests); returns its path."""
    target = Path(path(str(directory)))
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(bundle())
    return str(target)


def install(transport: Transport) -> str:
    """Upload the bundle into the run's work directory on the node, once per node and run; returns its path."""
    key = (transport.host, transport.run_id)
    remote = path(transport.workdir)
    with _lock:
        if key in _uploaded:
            return remote
    put(transport, bundle(), remote)
    with _lock:
        _uploaded.add(key)
    return remote


def to_send(transport: Transport) -> str | None:
    """What INSTALL reads on TRANSPORT's node: the bundle in base64, or None when it is there already (uploaded in
    this run). Pass the command's result to `carried`."""
    with _lock:
        return None if (transport.host, transport.run_id) in _uploaded else encoded()


def carried(transport: Transport, stdin: str | None, answer: CommandResult) -> None:
    """After a command that ran INSTALL with STDIN: the bundle is on the node when it went with the command and the
    program ran (whatever its own exit status)."""
    if stdin is not None and answer.exit_status not in (None, UPLOAD_FAILED):
        with _lock:
            _uploaded.add((transport.host, transport.run_id))


def command(python: str, workdir: str, program: str, *args: str) -> list[str]:
    """The command that runs PROGRAM of the bundle on a node."""
    if program not in PROGRAMS:
        raise ValueError(f"no remote program {program}")
    return [python, path(workdir), program, *args]
