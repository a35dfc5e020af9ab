"""Facts collector, the bundle's `facts` program, run on every node with that node's environment python.

Standard library only (Python 3.8); torch is probed in a child process (torchprobe.py), so a torch that hangs or
crashes cannot take the collector down. It gathers raw outputs and values and prints one JSON object; clustercheck
parses it once into a typed record on the control machine (clustercheck/facts/), where that logic is tested on
recorded outputs. A probe that fails records an "error" instead of raising (probing.py): the control side reports
"could not collect".
"""

import contextlib
import glob
import json
import os
import platform
import pwd
import re
import resource
import shutil
import socket
import sys
import threading
import time

from .managed import managed_files as read_managed_files
from .probing import PROBE_TIMEOUT, matching_lines, probe, read_text, run, run_all, run_of
from .torchprobe import TorchProbe

COMMANDS = {
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

XID_MARK = "NVRM: Xid"
# Besides the Xid lines, those that say from when an Xid counts (clustercheck/facts/xidlog.py): the driver's load,
# its line naming a GPU's UUID, and a GPU reset's acknowledgement (NVIDIA's NVSentinel writes it with logger).
TIME_MARKS = ("NVRM: loading NVIDIA UNIX", "GPU reset executed: ")  # kept however many Xid lines there are
XID_MARKS = (XID_MARK, "NVRM: GPU at PCI:", *TIME_MARKS)
RESET_TAG = "nvsentinel-gpu-reset"  # the syslog identifier of those acknowledgements
# journalctl's own -k is the match _TRANSPORT=kernel (and -b); "+" adds the acknowledgements, which are not the
# kernel's. SOURCE names what answered as the reports have always named it.
JOURNAL_MATCH = ["_TRANSPORT=kernel", "+", "SYSLOG_IDENTIFIER=" + RESET_TAG]
KERNEL_LOGS = (["journalctl", "-b", "--no-pager", "-q", "-o", "short-iso", *JOURNAL_MATCH], ["dmesg"])
SOURCES = {"journalctl": "journalctl -k -b", "dmesg": "dmesg"}


def xid_lines(timeout):
    """The NVIDIA driver's Xid lines since this boot, and the lines that mark the driver's load and GPU resets
    (XID_MARKS): journalctl's kernel messages of this boot read whole on the node (a long-running node's log is
    larger than what a probe sends back), else dmesg (the kernel's ring buffer); the program that answered is
    named. {"error": ...} when neither could be read."""
    errors = []
    for command in KERNEL_LOGS:
        answer = matching_lines(command, XID_MARKS, timeout, always=TIME_MARKS)
        if answer.get("rc") == 0 and answer.get("read"):
            answer["source"] = SOURCES.get(command[0]) or " ".join(command)
            return answer
        errors.append(answer.get("error") or (answer.get("err") or "").strip() or f"{command[0]}: nothing read")
    return {"error": "; ".join(errors)}


COMMANDS["xids"] = xid_lines
SMI_LIST = ["nvidia-smi", "-L"]
SMI_INDEX = re.compile(r"^GPU (\d+):", re.M)  # nvidia-smi -L: "GPU 0: NVIDIA H200 (UUID: GPU-...)"
SMI_GPU = re.compile(r"^GPU [0-9A-Fa-f]+:[0-9A-Fa-f]+:[0-9A-Fa-f]+\.[0-9A-Fa-f]+\s*$", re.M)  # nvidia-smi -q


def nvidia_smi_q(timeout):
    """`nvidia-smi -q` read GPU by GPU: `nvidia-smi -L` names the GPUs (and, where MIG is on, their MIG devices),
    then `nvidia-smi -q -i INDEX` runs for every GPU at once, each kept whole within the probe's output limit (with
    MIG on, eight GPUs' output passes it, and one `nvidia-smi -q` loses its head: the driver line and the first
    GPUs). The answer is one `nvidia-smi -q` text, the first GPU's whole (driver and CUDA header) and each other's
    from its GPU line on; a GPU whose own call failed is named in gpu_errors. Where -L names no GPU, plain
    `nvidia-smi -q` answers (and says why)."""
    started = time.monotonic()
    listed = run(SMI_LIST, timeout)
    indices = SMI_INDEX.findall(listed.get("out") or "") if listed.get("rc") == 0 else []
    left = max(1.0, timeout - (time.monotonic() - started))
    if not indices:
        return {**run(["nvidia-smi", "-q"], left), "list": listed}
    answers = {}

    def one(index):
        answers[index] = run(["nvidia-smi", "-q", "-i", index], left)

    threads = [threading.Thread(target=one, args=(index,), daemon=True) for index in indices]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(0.0, started + timeout - time.monotonic()))
    outputs, errors = [], {}
    for index in indices:
        answer = answers.get(index) or {"error": f"nvidia-smi -q -i {index} gave no answer within {timeout:g} s"}
        out = answer.get("out") or ""
        if answer.get("rc") == 0 and SMI_GPU.search(out):
            outputs.append(out)
        else:
            errors[index] = answer.get("error") or (answer.get("err") or out).strip()[-300:] or "no output"
    if not outputs:
        return {"rc": 1, "out": "", "err": "; ".join(f"GPU {i}: {e}" for i, e in errors.items()), "list": listed}
    seconds = round(time.monotonic() - started, 3)
    return {"rc": 0, "out": joined_smi_q(outputs), "err": "", "list": listed, "gpu_errors": errors, "seconds": seconds}


def joined_smi_q(outputs):
    """Per-GPU `nvidia-smi -q -i N` outputs as one `nvidia-smi -q`: the first whole (its header names the driver and
    CUDA), each other from its GPU line on."""
    parts = [out if not number else out[SMI_GPU.search(out).start() :] for number, out in enumerate(outputs)]
    return "".join(part if part.endswith("\n") else part + "\n" for part in parts)


COMMANDS["nvidia_smi_q"] = nvidia_smi_q
PROCESS_ID = re.compile(r"^\s*Process ID\s*:\s*(\d+)\s*$", re.M)  # nvidia-smi -q, section Processes
PROCESSES_KEPT = 64


def gpu_process_owners(smi):
    """Who runs each process nvidia-smi -q lists (SMI: its answer): the real user of /proc/PID/status's Uid, its
    name there and its command line; a process this collector cannot see (another PID namespace, gone since) says
    why. {pid: {...}}."""
    owners = {}
    pids = PROCESS_ID.findall((smi or {}).get("out") or "")
    for pid in list(dict.fromkeys(pids))[:PROCESSES_KEPT]:
        try:
            status = read_text(f"/proc/{pid}/status")
        except FileNotFoundError:
            owners[pid] = {"error": "no such process here (it ended, or runs in another PID namespace)"}
            continue
        except OSError as exc:
            owners[pid] = {"error": str(exc)}
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        uid = int(fields["Uid"].split()[0])
        try:
            user = pwd.getpwuid(uid).pw_name
        except KeyError:
            user = str(uid)
        entry = {"uid": uid, "user": user, "name": fields.get("Name", "").strip()}
        with contextlib.suppress(OSError):
            entry["command"] = read_text(f"/proc/{pid}/cmdline", 400).replace("\0", " ").strip()
        job = run_of(pid)  # a rank of a clustercheck run (its markers), which is no stranger's process
        if job is not None:
            entry["clustercheck_run"] = job
        owners[pid] = entry
    return owners


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


VISIBILITY = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")
STARTUP_FILES = (".profile", ".bash_profile", ".bash_login", ".bashrc", ".zshenv", ".zprofile", ".zshrc")


@fact("gpu_visibility")
def gpu_visibility():
    """The variables that hide GPUs from CUDA (CUDA_VISIBLE_DEVICES) or from a container (NVIDIA_VISIBLE_DEVICES):
    their values in the environment this collector and torch's import run in, and the lines that set them in the
    node's environment files and the login user's shell startup files, {path: [[line number, line], ...]} (only
    the lines that name them; the files read, not run)."""
    paths = ["/etc/environment", "/etc/bash.bashrc", *sorted(glob.glob("/etc/profile.d/*.sh"))]
    home = os.path.expanduser("~")
    paths += [os.path.join(home, name) for name in STARTUP_FILES] if home != "~" else []
    files = {}
    for path in paths:
        try:
            text = read_text(path)
        except OSError:
            continue
        lines = [[n, line] for n, line in enumerate(text.splitlines(), 1) if any(v in line for v in VISIBILITY)]
        if lines:
            files[path] = lines
    return {"environment": {k: os.environ[k] for k in VISIBILITY if k in os.environ}, "files": files}


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


UFW_RULES = "/etc/ufw/user.rules"  # ufw's rules as `ufw allow` wrote them, kept while ufw is disabled
ROLE_MARK = "clustercheck"  # site.yml's firewall role comments its rules so ('clustercheck SSH', ...)


@fact("firewall_role_rules")
def firewall_role_rules():
    """Whether site.yml's firewall role left its rules in ufw's rule file: ufw keeps a rule's comment there, hex
    encoded on its tuple line, also once ufw is disabled. False where there is no such file."""
    try:
        rules = read_text(UFW_RULES)
    except FileNotFoundError:
        return False
    return ROLE_MARK in rules or ROLE_MARK.encode().hex() in rules


@fact("managed_files")
def managed_files():
    """The configuration files site.yml's roles write, as this node has them (managed.py: hashed, the text where it
    may be shown), compared across the nodes on the control side."""
    return read_managed_files()


@fact("dcgmi")
def dcgmi():
    """Where dcgmi is installed; None when it is not."""
    return shutil.which("dcgmi")


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
    timeout = probe_timeout[-1] if probe_timeout else PROBE_TIMEOUT
    commands = run_all(COMMANDS, timeout)
    # The reads of files and the kernel's tables too, each in a thread: one that never returns (a file on a hung
    # mount, a FIFO) is named as hung, and the others still answer.
    reads = {
        "disk_root": lambda: disk_free("/"),
        "launch_files": launch_files,
        "gpu_bridges": gpu_bridges,
        **PROBES,
    }
    read = run_all({key: (lambda _timeout, f=function: probe(f)) for key, function in reads.items()}, timeout)
    facts = {"collector": 1, "python": python, **read()}
    facts["commands"] = commands()
    facts["gpu_processes"] = probe(lambda: gpu_process_owners(facts["commands"].get("nvidia_smi_q")))
    facts["torch"] = {"error": "the environment's python does not exist"} if torch is None else probe(torch.result)
    json.dump(facts, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
