"""torch and the packages users' jobs import beside it, as the facts collector probes them (standard library only,
Python 3.8): their versions from their installed metadata, without an import; the import itself in a child process
beside the other probes, so a torch that hangs or crashes cannot take the collector down; and, for node-health,
a successful import kept and taken again while nothing it depends on changed."""

import contextlib
import hashlib
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import time

from .probing import NO_WORKING_DIRECTORY, probe, read_text

# What only an import can tell, in a child process beside the other probes: whether torch imports, what it finds
# on this machine (CUDA devices; NCCL and cuDNN as loaded), which distributed backends it was built with, and
# whether each package users' jobs import beside torch imports (a torchvision built for another torch fails here).
# Versions come from the packages' metadata, read without an import (torch_metadata, package_metadata).
# argv: "torch" or "no-torch" (import torch or not), then a JSON object mapping each distribution to its modules.
# Run with `python -c`, without the working directory on sys.path (NO_WORKING_DIRECTORY: a user's cuda.py there would
# shadow a module torch imports; torch's own jobs run from the bundle, whose directory is sys.path[0] instead). An
# import that fails names a file it went through that no installed location holds (PYTHONPATH's, say): a local file
# shadowing a module.
IMPORT_PROBE = (
    NO_WORKING_DIRECTORY
    + r"""
import importlib, json
facts = {}


def shadowing(exc, before):
    import importlib.util, os, site, sysconfig, traceback
    paths = sysconfig.get_paths()
    installed = [paths.get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")]
    installed += list(getattr(site, "getsitepackages", lambda: [])()) + [site.getusersitepackages()]
    torch_home = getattr(importlib.util.find_spec("torch"), "submodule_search_locations", None) or []
    installed = [os.path.realpath(p) + os.sep for p in [*installed, *torch_home] if p]  # torch's own: a source build
    files = [frame.filename for frame in traceback.extract_tb(exc.__traceback__)]
    modules = {os.path.realpath(getattr(m, "__file__", None) or ""): n for n, m in list(sys.modules.items())}
    files += [getattr(sys.modules[n], "__file__", None) or "" for n in list(sys.modules) if n not in before]
    for path in map(os.path.realpath, files):
        if os.path.isfile(path) and not any(path.startswith(p) for p in installed):
            name = modules.get(path) or os.path.splitext(os.path.basename(path))[0]
            return {"module": name, "file": path}
    return None


if sys.argv[1] == "torch":
    before = set(sys.modules)
    try:
        import torch
        facts["version"] = torch.__version__
        facts["cuda"] = torch.version.cuda
        facts["cuda_available"] = bool(torch.cuda.is_available())
        facts["device_count"] = torch.cuda.device_count() if facts["cuda_available"] else 0
        try:
            facts["nccl"] = ".".join(map(str, torch.cuda.nccl.version())) if facts["cuda_available"] else None
        except Exception as exc:
            facts["nccl_error"] = f"{type(exc).__name__}: {exc}"
        try:
            facts["cudnn"] = torch.backends.cudnn.version() if facts["cuda_available"] else None
        except Exception as exc:
            facts["cudnn_error"] = f"{type(exc).__name__}: {exc}"
        facts["distributed"] = bool(torch.distributed.is_available())
        facts["gloo"] = bool(torch.distributed.is_available() and torch.distributed.is_gloo_available())
        facts["nccl_backend"] = bool(torch.distributed.is_available() and torch.distributed.is_nccl_available())
    except Exception as exc:
        facts["error"] = f"{type(exc).__name__}: {exc}"
        try:
            facts["shadow"] = shadowing(exc, before)
        except Exception:
            pass
errors = {}
for name, modules in json.loads(sys.argv[2]).items():
    for module in modules[:3]:
        try:
            importlib.import_module(module)
        except BaseException as exc:
            errors[name] = f"import {module}: {type(exc).__name__}: {exc}"
            break
facts["import_errors"] = errors
print(json.dumps(facts))
"""
)
TORCH_VERSION_FILE = re.compile(r"""^(__version__|cuda)\b[^=]*=\s*(?:'([^']*)'|"([^"]*)"|None)\s*$""", re.M)


def _metadata():
    try:
        from importlib import metadata
    except ImportError:  # Python < 3.8
        return None
    return metadata


def parse_torch_version_file(text):
    """torch/version.py as the build writes it (`__version__ = '2.13.0+cpu'`, `cuda: Optional[str] = '12.8'`):
    {"version": ..., "cuda": ...} without importing torch."""
    found = {}
    for match in TORCH_VERSION_FILE.finditer(text):
        key = "version" if match.group(1) == "__version__" else "cuda"
        value = match.group(2) if match.group(2) is not None else match.group(3)
        found[key] = value
    return found


def torch_metadata():
    """torch's version and the CUDA version it was built for, from its installed files, without an import: its
    version.py (where torch.__version__ and torch.version.cuda come from), else its dist-info; None when torch is
    not on this python's path at all."""
    import importlib.util

    spec = importlib.util.find_spec("torch")
    if spec is None:
        return None
    found = {}
    metadata = _metadata()
    if metadata is not None:
        with contextlib.suppress(Exception):
            found["version"] = metadata.version("torch")
    for directory in spec.submodule_search_locations or []:
        with contextlib.suppress(OSError):
            found.update(parse_torch_version_file(read_text(os.path.join(directory, "version.py"))))
            break
    return found


def package_metadata(wanted):
    """Each distribution's version, top-level modules and torch requirement, from its metadata; torchvision
    too when it is installed."""
    metadata = _metadata()
    packages = {}
    if metadata is None:
        return packages
    with contextlib.suppress(Exception):
        metadata.version("torchvision")
        wanted = [*wanted, "torchvision"]
    for name in dict.fromkeys(wanted):
        info = {}
        packages[name] = info
        try:
            info["version"] = metadata.version(name)
        except Exception:
            info["error"] = "not installed"
            continue
        try:
            top = (metadata.distribution(name).read_text("top_level.txt") or "").split()
        except Exception:
            top = []
        info["modules"] = [m for m in top if not m.startswith("_")] or [name.replace("-", "_").lower()]
        info["requires_torch"] = [r for r in (metadata.requires(name) or []) if r.split(";")[0].startswith("torch")]
    return packages


class TorchProbe:
    """torch and the packages beside it: their versions from metadata at once; the import in a child process,
    started at once and read when the other probes are done.

    REUSE (a file and a maximum age in seconds) lets a health program that runs every few minutes skip the import
    (about a second): a successful import is kept in the file with the fingerprint of what it depends on
    (import_fingerprint), and taken again while that fingerprint is unchanged and the import is younger than the
    age. A failed import is never kept, so a node is judged anew every run until it imports again."""

    def __init__(self, timeout, wanted, reuse=None):
        self.timeout = timeout
        self.started = time.monotonic()
        self.versions = probe(torch_metadata)  # None: torch is not on this python's path
        self.packages = probe(lambda: package_metadata(wanted))
        if "error" in self.packages:
            self.packages = {}
        importable = {n: i["modules"] for n, i in self.packages.items() if "modules" in i}
        self.proc = None
        self.failed = None
        self.reuse = reuse
        self.reused = None  # (the kept answer, when it was imported) when the import is not run again
        if self.versions is None and not importable:
            return
        if reuse is not None:
            self.fingerprint = probe(lambda: import_fingerprint(self.versions is not None, importable))
            self.reused = probe(lambda: kept_import(reuse[0], reuse[1], self.fingerprint))
            if self.reused is not None and "error" not in self.reused:
                return
            self.reused = None
        argv = [sys.executable, "-c", IMPORT_PROBE, "no-torch" if self.versions is None else "torch"]
        try:
            self.proc = subprocess.Popen(
                [*argv, json.dumps(importable)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                errors="replace",
            )
        except OSError as exc:
            self.failed = {"error": f"{sys.executable}: {exc}"}

    def result(self):
        if self.reused is not None:
            imported, at = self.reused
        else:
            imported, at = self._imported(), None
            if self.reuse is not None and not imported.get("error") and not imported.get("import_errors"):
                probe(lambda: keep_import(self.reuse[0], self.fingerprint, imported))
        if "import_errors" not in imported:  # the child itself failed (crashed, timed out): nothing is known
            return {"error": imported.get("error", "the import probe did not answer")}
        if self.versions is None:
            facts = {"error": "ModuleNotFoundError: No module named 'torch'"}  # what the import says
        elif "error" in imported:
            facts = {"error": imported["error"], "installed": self.versions}  # torch is there, and fails to import
            if imported.get("shadow"):
                facts["shadow"] = imported["shadow"]
        else:
            facts = {k: v for k, v in imported.items() if k != "import_errors"}
            if "error" not in self.versions:
                facts.update(self.versions)  # the metadata's versions; the import's where it has none
        for name, error in imported["import_errors"].items():
            self.packages[name]["error"] = error
        facts["packages"] = self.packages
        if at is not None:
            facts["imported_at"] = at
        return facts

    def _imported(self):
        if self.failed:
            return self.failed
        if self.proc is None:
            return {"import_errors": {}}
        left = max(0.0, self.timeout - (time.monotonic() - self.started))
        try:
            out, err = self.proc.communicate(timeout=left)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()
            return {"error": f"importing torch took more than {self.timeout} s"}
        lines = out.strip().splitlines()
        if self.proc.returncode != 0 or not lines:
            return {"error": (err.strip().splitlines() or [f"exit {self.proc.returncode}"])[-1]}
        try:
            return json.loads(lines[-1])
        except ValueError:
            return {"error": f"the import probe printed no JSON: {lines[-1][:200]}"}


def import_fingerprint(torch, importable):
    """What the import probe's answer depends on that can change while a node runs, read without importing:
    this python; the entries of every directory on its path (a package installed, removed or upgraded adds or
    removes a directory there) and torch's own directory and libraries; the NVIDIA driver loaded and its device
    files (/dev/nvidia-uvm missing is a classic reason CUDA fails while nvidia-smi works); the variables that
    steer the import; this boot. A sha256 of them all."""
    seen = {"python": [sys.executable, sys.version], "torch": torch, "importable": importable, "stat": {}}
    for directory in [p for p in sys.path[1:] if p and os.path.isdir(p)]:  # [0]: this collector's own bundle
        seen["stat"][directory] = _stat(directory)
    spec = importlib.util.find_spec("torch") if torch else None
    if spec is not None and spec.submodule_search_locations:
        base = next(iter(spec.submodule_search_locations))
        for path in [base, os.path.join(base, "version.py"), os.path.join(base, "lib")]:
            seen["stat"][path] = _stat(path)
        lib = os.path.join(base, "lib")
        if os.path.isdir(lib):
            seen["libraries"] = {name: _stat(os.path.join(lib, name)) for name in sorted(os.listdir(lib))}
    for key, path in (("driver", "/proc/driver/nvidia/version"), ("boot", "/proc/sys/kernel/random/boot_id")):
        seen[key] = read_text(path) if os.path.exists(path) else None
    seen["devices"] = sorted(name for name in os.listdir("/dev") if name.startswith("nvidia"))
    seen["environment"] = {k: os.environ.get(k) for k in IMPORT_VARIABLES}
    return hashlib.sha256(json.dumps(seen, sort_keys=True).encode()).hexdigest()


# Variables that change what the import finds (libraries, devices, the path).
IMPORT_VARIABLES = ("LD_LIBRARY_PATH", "LD_PRELOAD", "PYTHONPATH", "CUDA_VISIBLE_DEVICES", "CUDA_HOME")


def _stat(path):
    try:
        found = os.stat(path)
    except OSError as exc:
        return exc.errno
    return [found.st_mtime_ns, found.st_size, found.st_ino]


def kept_import(path, max_age, fingerprint):
    """The kept import probe's answer and when it ran, if PATH holds one for FINGERPRINT younger than MAX_AGE
    seconds; else None."""
    try:
        with open(path) as fh:
            kept = json.load(fh)
    except (OSError, ValueError):
        return None
    at = kept.get("at") if isinstance(kept, dict) else None
    if not isinstance(at, (int, float)) or kept.get("fingerprint") != fingerprint:
        return None
    if not 0 <= time.time() - at <= max_age or not isinstance(kept.get("imported"), dict):
        return None
    return kept["imported"], at


def keep_import(path, fingerprint, imported):
    """Keep the import probe's answer IMPORTED for FINGERPRINT in PATH, replaced atomically."""
    directory = os.path.dirname(path)
    fd, temporary = tempfile.mkstemp(dir=directory, prefix=".import-")
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump({"fingerprint": fingerprint, "at": time.time(), "imported": imported}, fh)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
