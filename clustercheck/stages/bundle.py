"""The node-side package (clustercheck/remote/), bundled as one zip application and uploaded once per node.

On the node it runs as `PYTHON WORKDIR/clustercheck-remote.pyz PROGRAM ARGS...` (programs: facts, netprobe,
collectives, ddp); torchrun starts the torch workers the same way, with the zip as its script.
"""

from __future__ import annotations

import functools
import io
import tempfile
import threading
import zipfile
from importlib import resources
from pathlib import Path

from clustercheck.transport import Transport

PACKAGE = "clustercheck_remote"  # its name on the node, so it never shadows an installed clustercheck
FILE = "clustercheck-remote.pyz"
PROGRAMS = ("facts", "netprobe", "data", "collectives", "ddp", "lightning")

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
    with tempfile.TemporaryDirectory() as tmp:
        local = Path(tmp) / FILE
        local.write_bytes(bundle())
        transport.put(str(local), remote)
    with _lock:
        _uploaded.add(key)
    return remote


def command(python: str, workdir: str, program: str, *args: str) -> list[str]:
    """The command that runs PROGRAM of the bundle on a node."""
    if program not in PROGRAMS:
        raise ValueError(f"no remote program {program}")
    return [python, path(workdir), program, *args]
