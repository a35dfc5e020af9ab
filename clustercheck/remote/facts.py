"""Facts collector, run on every node with that node's environment python (`python -m clustercheck_remote.facts`).

Standard library only; torch is probed in a child process, so a torch that hangs or crashes cannot take the
collector down. It gathers raw outputs and values and prints one JSON object; clustercheck parses it once into a
typed record on the control machine (clustercheck/facts/), where that logic is tested on recorded outputs. A probe
that fails records an "error" instead of raising: the control side reports "could not collect".
"""

import contextlib
import glob
import hashlib
import importlib.util
import json
import os
import platform
import re
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

# What only an import can tell, in a child process beside the other probes: whether torch imports, what it finds
# on this machine (CUDA devices; NCCL and cuDNN as loaded), which distributed backends it was built with, and
# whether each package users' jobs import beside torch imports (a torchvision built for another torch fails here).
# Versions come from the packages' metadata, read without an import (torch_metadata, package_metadata).
# argv: "torch" or "no-torch" (import torch or not), then a JSON object mapping each distribution to its modules.
IMPORT_PROBE = r"""
import importlib, json, sys
facts = {}
if sys.argv[1] == "torch":
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
TORCH_VERSION_FILE = re.compile(r"""^(__version__|cuda)\b[^=]*=\s*(?:'([^']*)'|"([^"]*)"|None)\s*$""", re.M)

COMMANDS = {
    "nvidia_smi_q": ["nvidia-smi", "-q"],
    "kernel_log": ["journalctl", "-k", "--since=-24h", "--no-pager", "-q", "-o", "short-iso"],
    "dmesg": ["dmesg"],
    "fabricmanager": ["systemctl", "is-active", "nvidia-fabricmanager"],
    "timedatectl": ["timedatectl", "show", "-p", "NTPSynchronized", "-p", "NTP", "-p", "Timezone"],
    "chronyc": ["chronyc", "-n", "tracking"],
    "ufw": ["ufw", "status"],
    "nft": ["nft", "list", "ruleset"],
    "iptables": ["iptables", "-S"],
    "ip_addr": ["ip", "-o", "addr", "show"],
    "ip_route": ["ip", "-o", "route", "get", "1.1.1.1"],
    "nvlink": ["nvidia-smi", "nvlink", "-s"],
    "nvlink_errors": ["nvidia-smi", "nvlink", "-e"],
    "virt": ["systemd-detect-virt", "--vm"],  # "none" on bare metal and in containers
}
OUTPUT_LIMIT = 200_000

# Every per-node fact the collector reports under a key of its own, declared once with @fact: its key and the
# function that gathers it. The controller's NodeFacts names each of these functions in the field it fills
# (clustercheck/facts/model.py); the raw outputs of COMMANDS, torch and the disk, launch-file and GPU-bridge
# probes are read by hand there.
PROBES = {}


def fact(key):
    """Declare FUNCTION as the probe of the fact reported under KEY."""

    def declare(function):
        assert key not in PROBES, key
        PROBES[key] = function
        return function

    return declare


PROBE_TIMEOUT = 20.0  # seconds each probe command may take, unless --probe-timeout says otherwise


def run(command, timeout=PROBE_TIMEOUT):
    """Run a probe command; never raises."""
    if not shutil.which(command[0]):
        return {"error": f"{command[0]} not found"}
    try:
        proc = subprocess.run(command, capture_output=True, text=True, errors="replace", timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"{command[0]} timed out after {timeout:g} s"}
    except OSError as exc:
        return {"error": f"{command[0]}: {exc}"}
    return {"rc": proc.returncode, "out": proc.stdout[-OUTPUT_LIMIT:], "err": proc.stderr[-2000:]}


def probe(function):
    try:
        return function()
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}


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
            facts = {"error": imported["error"]}
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


@fact("os")
def os_facts():
    release = {}
    with open("/etc/os-release") as fh:
        for line in fh:
            key, sep, value = line.strip().partition("=")
            if sep:
                release[key] = value.strip('"')
    cpu_model = None
    with open("/proc/cpuinfo") as fh:
        for line in fh:
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    mem_kb = None
    with open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("MemTotal:"):
                mem_kb = int(line.split()[1])
    return {
        "pretty_name": release.get("PRETTY_NAME"),
        "id": release.get("ID"),
        "version_id": release.get("VERSION_ID"),
        "kernel": platform.release(),
        "arch": platform.machine(),
        "cpu_model": cpu_model,
        "cpus": os.cpu_count(),
        "mem_total_bytes": mem_kb * 1024 if mem_kb else None,
    }


def disk_free(path):
    st = os.statvfs(path)
    return {"path": path, "free_bytes": st.f_bavail * st.f_frsize, "total_bytes": st.f_blocks * st.f_frsize}


@fact("shm")
def shm():
    return disk_free("/dev/shm")


# The kernel's IPv4 neighbour (ARP) table limits. They exist in the host's initial network namespace only: a
# container with a namespace of its own has no default/ directory there (it shares the host's table), reported {}.
NEIGH_DEFAULTS = "/proc/sys/net/ipv4/neigh/default"


@fact("neigh_thresholds")
def neigh_thresholds():
    if not os.path.isdir(NEIGH_DEFAULTS):
        return {}
    return {name: int(read_text(os.path.join(NEIGH_DEFAULTS, name))) for name in ("gc_thresh2", "gc_thresh3")}


@fact("memlock")
def memlock():
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return {
        "soft": None if soft == resource.RLIM_INFINITY else soft,
        "hard": None if hard == resource.RLIM_INFINITY else hard,
    }


@fact("hostname")
def hostname_facts():
    name = socket.gethostname()
    try:
        infos = socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)
        addresses = sorted({info[4][0] for info in infos})
    except OSError as exc:
        return {"hostname": name, "error": f"does not resolve: {exc}"}
    return {"hostname": name, "addresses": addresses}


@fact("mtu")
def mtus():
    result = {}
    for iface in sorted(os.listdir("/sys/class/net")):
        try:
            with open(f"/sys/class/net/{iface}/mtu") as fh:
                result[iface] = int(fh.read().strip())
        except (OSError, ValueError):
            continue
    return result


@fact("nvswitches")
def nvswitches():
    path = "/proc/driver/nvidia-nvswitch/devices"
    return len(os.listdir(path)) if os.path.isdir(path) else 0


LAUNCH_FILES = ("/etc/environment", "/etc/nccl.conf")  # and /etc/profile.d/*.sh: what a login shell's jobs get
FILE_LIMIT = 64_000


@fact("packages")
def packages():
    """The environment's Python distributions (what `pip freeze` lists) and, in a conda environment, its
    conda-meta records (what `conda list` shows), without running pip or conda."""
    try:
        from importlib import metadata
    except ImportError:  # Python < 3.8
        return {"error": "importlib.metadata needs Python 3.8"}
    pip = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            pip.setdefault(name, dist.version)
    result = {"pip": pip, "prefix": sys.prefix}
    meta = os.path.join(sys.prefix, "conda-meta")
    if os.path.isdir(meta):
        conda = {}
        for path in sorted(glob.glob(os.path.join(meta, "*.json"))):
            try:
                with open(path) as fh:
                    record = json.load(fh)
                conda[record["name"]] = "{}={}".format(record.get("version", "?"), record.get("build", "?"))
            except (OSError, ValueError, KeyError, TypeError):
                continue
        result["conda"] = conda
    return result


def read_text(path, limit=FILE_LIMIT):
    with open(path, errors="replace") as fh:
        return fh.read(limit)


def launch_files():
    """The files that set a user's job environment: NCCL_* and GLOO_* are read out of them on the control side."""
    files = {}
    for path in list(LAUNCH_FILES) + sorted(glob.glob("/etc/profile.d/*.sh")):
        try:
            files[path] = read_text(path)
        except FileNotFoundError:
            continue
        except OSError as exc:
            files[path] = {"error": str(exc)}
    return files


@fact("netdevs")
def netdevs():
    """Every network interface: its ARP type (772 loopback, 1 Ethernet, 32 InfiniBand), whether it is a bridge
    or virtual (veth, docker0), and its state."""
    result = {}
    for iface in sorted(os.listdir("/sys/class/net")):
        base = "/sys/class/net/" + iface
        entry = {
            "bridge": os.path.isdir(base + "/bridge"),
            "virtual": "/devices/virtual/" in os.path.realpath(base),
        }
        for name in ("type", "operstate"):
            try:
                entry[name] = read_text(base + "/" + name).strip()
            except OSError:
                entry[name] = None
        result[iface] = entry
    return result


@fact("infiniband")
def infiniband():
    """RDMA ports from /sys/class/infiniband (InfiniBand and RoCE alike); {} when there are none."""
    root = "/sys/class/infiniband"
    result = {}
    if not os.path.isdir(root):
        return result
    for device in sorted(os.listdir(root)):
        ports = {}
        for port in sorted(os.listdir(os.path.join(root, device, "ports"))):
            entry = {}
            for name in ("state", "phys_state", "rate", "link_layer"):
                try:
                    entry[name] = read_text(os.path.join(root, device, "ports", port, name)).strip()
                except OSError:
                    entry[name] = None
            ports[port] = entry
        result[device] = ports
    return result


BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
NVIDIA_GPU_CLASSES = ("0x0300", "0x0302")  # VGA and 3D controllers


def gpu_bridges():
    """The PCIe bridges between each NVIDIA GPU and the root complex (from the sysfs path), and each bridge's
    `lspci -vvv`, whose ACSCtl line says whether peer-to-peer traffic is redirected to the root complex."""
    root = "/sys/bus/pci/devices"
    gpus = {}
    iommu = {}  # each GPU's IOMMU domain type (identity, DMA, DMA-FQ); none when the IOMMU is off
    if not os.path.isdir(root):
        return {"gpus": gpus, "lspci": {}, "iommu": iommu}
    for device in sorted(os.listdir(root)):
        try:
            vendor = read_text(os.path.join(root, device, "vendor")).strip()
            klass = read_text(os.path.join(root, device, "class")).strip()
        except OSError:
            continue
        if vendor == "0x10de" and klass.startswith(NVIDIA_GPU_CLASSES):
            path = os.path.realpath(os.path.join(root, device)).split("/")
            gpus[device] = [part for part in path if BDF.match(part) and part != device]
            with contextlib.suppress(OSError):  # no iommu_group: the IOMMU is off
                iommu[device] = read_text(os.path.join(root, device, "iommu_group", "type")).strip()
    bridges = sorted({b for chain in gpus.values() for b in chain})
    lspci = {b: run(["lspci", "-vvv", "-s", b], timeout=10) for b in bridges} if len(gpus) > 1 else {}
    return {"gpus": gpus, "lspci": lspci, "iommu": iommu}


@fact("modules")
def kernel_modules():
    with open("/proc/modules") as fh:
        return sorted(line.split()[0] for line in fh if line.strip())


@fact("cmdline")
def cmdline():
    return read_text("/proc/cmdline").strip()


@fact("dcgmi")
def dcgmi():
    """Where dcgmi is installed; None when it is not."""
    return shutil.which("dcgmi")


def run_all(commands, timeout=PROBE_TIMEOUT):
    """Every probe command at once, each in a thread of its own (they wait on their programs, not on a CPU), each
    stopped at TIMEOUT seconds (a hung nvidia-smi is reported as such, the others still answer)."""
    results = {}

    def one(name, command):
        results[name] = run(command, timeout)

    threads = [threading.Thread(target=one, args=item, daemon=True) for item in commands.items()]
    for thread in threads:
        thread.start()

    def wait():
        for thread in threads:
            thread.join()
        return {name: results[name] for name in commands}

    return wait


def main():
    """facts TIMEOUT [--no-torch | --environment-only] [--probe-timeout S] [--package DIST ...]
    [--reuse-import FILE MAX_AGE]. --environment-only: the python, its packages and torch, nothing of the node (what
    a container image holds, read inside it)."""
    torch_timeout = float(sys.argv[1]) if len(sys.argv) > 1 else 120
    wanted = [sys.argv[i + 1] for i, word in enumerate(sys.argv[:-1]) if word == "--package"]
    probe_timeout = [float(sys.argv[i + 1]) for i, word in enumerate(sys.argv[:-1]) if word == "--probe-timeout"]
    reuse = [
        (sys.argv[i + 1], float(sys.argv[i + 2])) for i, word in enumerate(sys.argv[:-2]) if word == "--reuse-import"
    ]
    # The slow probes first, each in the background: torch's import in a child process, the commands in
    # threads; the quick reads of /proc and /sys meanwhile.
    torch = None if "--no-torch" in sys.argv else TorchProbe(torch_timeout, wanted, reuse[-1] if reuse else None)
    python = {"executable": sys.executable, "version": platform.python_version()}
    if "--environment-only" in sys.argv:
        facts = {"collector": 1, "python": python, "packages": probe(packages)}
        facts["torch"] = probe(torch.result) if torch else {"error": "not asked for"}
        json.dump(facts, sys.stdout)
        sys.stdout.write("\n")
        return 0
    commands = run_all(COMMANDS, probe_timeout[-1] if probe_timeout else PROBE_TIMEOUT)
    facts = {
        "collector": 1,
        "python": python,
        "disk_root": probe(lambda: disk_free("/")),
        "disk_tmp": probe(lambda: disk_free(tempfile.gettempdir())),
        "launch_files": probe(launch_files),
        "gpu_bridges": probe(gpu_bridges),
    }
    facts.update((key, probe(function)) for key, function in PROBES.items())
    facts["commands"] = commands()
    facts["torch"] = {"error": "the environment's python does not exist"} if torch is None else probe(torch.result)
    json.dump(facts, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
