"""What the benchmarks share: the nodes to measure (the Docker test cluster, or the user's own inventory), running
`clustercheck run` and Ansible the way a user runs them, timing (wall clock, the CPU time of the command, and on
the test cluster the CPU time its nodes spent), medians, and a description of the machine.

Absolute times on a shared machine move from run to run; the benchmarks measure ratios within one run, in
interleaved rounds, and report medians.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "cluster"))  # testcluster and torchenv: standard library and paramiko

import testcluster  # noqa: E402

TORCH_PIN = "torch==2.13.0"


# --------------------------------------------------------------------------- the machine


def machine() -> dict:
    """nproc, the CPU model and the load average now (the other work on a shared machine)."""
    model = platform.processor() or "?"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as fh:
        for line in fh:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {"nproc": os.cpu_count(), "cpu_model": model, "load_average": [round(x, 2) for x in os.getloadavg()]}


def describe(info: dict) -> str:
    load = " ".join(f"{x:.2f}" for x in info["load_average"])
    return f"{info['nproc']} cores ({info['cpu_model']}), load average {load}"


# --------------------------------------------------------------------------- the nodes


@dataclass
class Nodes:
    """The inventory to run against, its node names in order, and (test cluster only) each node's container."""

    inventory: str
    names: list[str]
    containers: dict[str, str] = field(default_factory=dict)
    ssh_config: str | None = None  # an empty SSH config on the test cluster: the user's ~/.ssh/config stays out
    cluster: object | None = None  # the testcluster.Cluster, when it is one

    def limit(self, names: list[str]) -> str:
        return ",".join(names)


def own_nodes(inventory: str, limit: str | None = None) -> Nodes:
    """The user's own nodes: the inventory (or host list) clustercheck reads, narrowed by LIMIT."""
    from clustercheck.inventory import load

    nodes = load(inventory, limit)
    if not nodes:
        raise SystemExit(f"benchmark: no node in {inventory}" + (f" matches --limit {limit}" if limit else ""))
    return Nodes(inventory, [n.name for n in nodes])


def cluster_name(suffix: str) -> str:
    return os.environ.get("TESTCLUSTER_NAME", testcluster.DEFAULT_NAME) + suffix


@contextlib.contextmanager
def test_cluster(size: int, suffix: str, reuse: bool, keep: bool) -> Iterator[Nodes]:
    """SIZE Debian 12 nodes of the Docker test cluster named $TESTCLUSTER_NAME + SUFFIX: brought up (or, with
    REUSE, the one already up), and taken down afterwards unless KEEP."""
    name = cluster_name(suffix)
    if size > 20:  # systemd in many containers needs more inotify instances than the kernel's default
        raise_limits()
    cluster = None
    if reuse:
        with contextlib.suppress(testcluster.ClusterError):
            cluster = testcluster.Cluster.load(name)
        if cluster is not None and len(cluster.nodes) != size:
            cluster = None
    brought_up = cluster is None
    if cluster is None:
        print(f"benchmark: bringing up {size} test nodes ({name})", file=sys.stderr)
        cluster = testcluster.up(size, name=name)
    config = Path(cluster.state_dir) / "empty_ssh_config"
    config.touch()
    try:
        yield Nodes(
            cluster.inventory,
            [n.name for n in cluster.nodes],
            {n.name: n.container for n in cluster.nodes},
            str(config),
            cluster,
        )
    finally:
        if brought_up and not keep:
            print(f"benchmark: taking {name} down", file=sys.stderr)
            testcluster.down(name)


def raise_limits() -> None:
    sys.path.insert(0, str(REPO / "tests"))
    from harness import raise_machine_limits

    problems = raise_machine_limits()
    if problems:
        raise SystemExit("benchmark: cannot raise the machine's limits for many nodes: " + "; ".join(problems))


def wheelhouse() -> Path:
    """The torch wheelhouse the cluster tests use (built with pip download when it is not there yet)."""
    target = testcluster.CACHE_DIR / "wheelhouse"
    stamp = target / ".complete"
    if stamp.exists() and stamp.read_text().strip() == TORCH_PIN:
        return target
    target.mkdir(parents=True, exist_ok=True)
    pip = [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "-d", str(target)]
    subprocess.run([*pip, "-c", str(REPO / "constraints.txt"), TORCH_PIN], check=True)
    stamp.write_text(TORCH_PIN + "\n")
    return target


def install_torch(nodes: Nodes, names: list[str]) -> None:
    """torch into /opt/clustercheck/venv on NAMES of the test cluster, recorded as the environment's python."""
    import torchenv

    cluster = nodes.cluster
    subset = testcluster.Cluster(**{**asdict(cluster), "nodes": [cluster.node(n) for n in names]})
    errors = torchenv.install(subset, wheelhouse())
    if errors:
        raise SystemExit("benchmark: could not install torch: " + "; ".join(errors))


# --------------------------------------------------------------------------- node CPU time (test cluster)


def _cgroup_files(container: str) -> list[Path]:
    cid = subprocess.run(
        ["docker", "inspect", "--format", "{{.Id}}", container], capture_output=True, text=True, check=False
    ).stdout.strip()
    root = Path("/sys/fs/cgroup")
    return [
        root / "cpuacct" / "docker" / cid / "cpuacct.usage",  # cgroup v1 (nanoseconds)
        root / "system.slice" / f"docker-{cid}.scope" / "cpu.stat",  # cgroup v2, systemd driver
        root / "docker" / cid / "cpu.stat",  # cgroup v2, cgroupfs driver
    ]


class NodeCpu:
    """The CPU seconds the test cluster's containers spent, from their cgroups (None where unreadable)."""

    def __init__(self, nodes: Nodes) -> None:
        self.files = {}
        for name, container in nodes.containers.items():
            found = next((p for p in _cgroup_files(container) if p.exists()), None)
            if found:
                self.files[name] = found

    def read(self, names: list[str]) -> float | None:
        if not names or any(n not in self.files for n in names):
            return None
        total = 0.0
        for name in names:
            path = self.files[name]
            text = path.read_text()
            if path.name == "cpuacct.usage":
                total += int(text) / 1e9
            else:
                usage = next(line.split()[1] for line in text.splitlines() if line.startswith("usage_usec"))
                total += int(usage) / 1e6
        return total


# --------------------------------------------------------------------------- timing a command


@dataclass
class Timing:
    wall: float  # seconds
    cpu: float  # user + system seconds of the command and the children it waited for
    node_cpu: float | None  # CPU seconds the measured nodes spent meanwhile (test cluster only)
    returncode: int
    stdout: str = ""
    stderr: str = ""


def timed(argv: list[str], *, cpu: NodeCpu | None = None, names: list[str] = (), env=None, cwd=None) -> Timing:
    """Run ARGV; its wall time, its CPU time (os.wait4's resource usage), and the nodes' CPU time."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        before = cpu.read(list(names)) if cpu else None
        started = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=out, stderr=err, env=env, cwd=cwd)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - started
        after = cpu.read(list(names)) if cpu else None
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return Timing(
            wall,
            usage.ru_utime + usage.ru_stime,
            None if before is None or after is None else after - before,
            proc.returncode,
            out.read().decode(errors="replace"),
            err.read().decode(errors="replace"),
        )


def clustercheck_exe() -> str:
    beside = Path(sys.executable).parent / "clustercheck"
    found = str(beside) if beside.exists() else shutil.which("clustercheck")
    if not found:
        raise SystemExit("benchmark: clustercheck is not installed (pip install -e . in this checkout)")
    return found


def core_stage(nodes: Nodes, names: list[str], run_dir: Path, *extra: str) -> list[str]:
    """`clustercheck run --only core` on NAMES, as a user runs it, with a JSON report on stdout."""
    argv = [clustercheck_exe(), "run", "--hosts", nodes.inventory, "--limit", nodes.limit(names), "--only", "core"]
    if nodes.ssh_config:
        argv += ["--ssh-config", nodes.ssh_config]
    return [*argv, "--run-dir", str(run_dir), "--format", "json", *extra]


def reached_every_node(timing: Timing, names: list[str]) -> str | None:
    """None when every node was connected to and its facts collected; else what went wrong (the figure would not
    be a measurement of the core stage)."""
    try:
        checks = json.loads(timing.stdout)["checks"]
    except (ValueError, KeyError):
        return f"no JSON report (exit {timing.returncode}): {timing.stderr.strip()[-300:]}"
    ok = {(c["name"], c["host"]) for c in checks if c["status"] == "PASS"}
    missing = [n for n in names if ("connect", n) not in ok or ("facts", n) not in ok]
    if missing:
        messages = {c["host"]: c["message"] for c in checks if c["name"] in ("connect", "facts")}
        return "not reached or no facts: " + "; ".join(f"{n}: {messages.get(n, '?')}" for n in missing)
    return None


def median(values: list[float]) -> float:
    return statistics.median(values)


def write_json(path: str | None, data: dict) -> None:
    if path:
        Path(path).write_text(json.dumps(data, indent=2) + "\n")
        print(f"benchmark: figures written to {path}", file=sys.stderr)
