"""What the benchmarks share: the nodes to measure (the Docker test cluster, or the user's own inventory), the
options every benchmark takes, running `clustercheck run` and Ansible the way a user runs them, commands started
on every node at once over OpenSSH as a person would, timing (wall clock, the CPU time of the command, and on the
test cluster the CPU time its nodes spent), medians, a description of the machine, and the JSON output.

The test cluster comes from the test suite's own machinery (tests/cluster/testcluster.py, tests/cluster/torchenv.py,
tests/conftest.py), under the name TESTCLUSTER_NAME (default "bench") plus a suffix per kind of cluster; one this
benchmark brought up is removed afterwards unless --keep is given, and with --reuse one already up with the same
shape is measured (and left up).

Absolute times on a shared machine move from run to run; the benchmarks measure ratios within one run, in
interleaved rounds, and report medians.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
for _path in (REPO / "tests", REPO / "tests" / "cluster"):  # testcluster, torchenv and conftest
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import testcluster  # noqa: E402

from clustercheck import inventory  # noqa: E402


class BenchmarkError(RuntimeError):
    """A benchmark that could not measure (a node unreachable, a job that failed); printed as one line."""


def run(name: str, main) -> int:
    """MAIN()'s exit code; a benchmark that could not measure says why in one line and exits 1."""
    try:
        return main()
    except (BenchmarkError, subprocess.TimeoutExpired) as exc:
        print(f"{name}: error: {exc}", file=sys.stderr)
        return 1


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- options and output


def parser(description: str, rounds: int, *, limit: bool = False, epilog: str | None = None) -> argparse.ArgumentParser:
    """The options every benchmark takes (--limit where the benchmark measures a part of the inventory)."""
    p = argparse.ArgumentParser(description=description, epilog=epilog)
    p.add_argument("--hosts", metavar="INVENTORY", help="your own nodes: an Ansible inventory (default: test nodes)")
    if limit:
        p.add_argument("--limit", metavar="PATTERN", help="with --hosts: only these nodes")
    p.add_argument("--rounds", metavar="N", type=int, default=rounds, help="measured rounds (default %(default)s)")
    p.add_argument("--json", metavar="FILE", help="also write the figures as JSON to FILE")
    p.add_argument("--reuse", action="store_true", help="use the test cluster already up under the same name")
    p.add_argument("--keep", action="store_true", help="leave the test cluster up afterwards")
    return p


def pairs(
    rounds: int, clustercheck: Callable[[int], dict], other_name: str, other: Callable[[int], dict]
) -> Iterator[dict]:
    """ROUNDS pairs of clustercheck's side and the OTHER side, alternating: clustercheck first in odd pairs (the
    first one included: the other side may run the command line clustercheck recorded), the other first in even
    ones. Every pair counts (no warm-up pair). Each pair is both sides' figures (each side is called with the
    pair's index), its order and the load average after it."""
    sides = {"clustercheck": clustercheck, other_name: other}
    for i in range(rounds):
        order = ("clustercheck", other_name) if i % 2 == 0 else (other_name, "clustercheck")
        pair: dict = {}
        for side in order:
            pair.update(sides[side](i))
        pair["order"] = " first, ".join(order) + " second"
        pair["load_average"] = machine()["load_average"]
        yield pair


def machine() -> dict:
    """The control machine: cores, CPU model, the load average now (the other work on a shared machine) and the
    time, recorded beside every figure."""
    model = ""
    with contextlib.suppress(OSError):
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        model = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "")
    return {
        "nproc": os.cpu_count(),
        "cpu_model": model or platform.processor() or "?",
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def describe(info: dict) -> str:
    load = " ".join(f"{x:.2f}" for x in info["load_average"])
    return f"{info['nproc']} cores ({info['cpu_model']}), load average {load}"


def median(values: list[float]) -> float:
    return statistics.median(values)


def write_json(path: str | None, data: dict) -> None:
    if path:
        Path(path).write_text(json.dumps(data, indent=2) + "\n")
        say(f"benchmark: figures written to {path}")


# --------------------------------------------------------------------------- the nodes


@dataclass
class Nodes:
    """The nodes a benchmark runs on: an inventory clustercheck and Ansible read, the same nodes for OpenSSH, and
    (test cluster only) each node's container."""

    inventory: str
    nodes: list[inventory.Node]
    ssh_config: str | None = None  # an empty SSH config on the test cluster: the user's ~/.ssh/config stays out
    cluster: testcluster.Cluster | None = None  # the test cluster, when it is one
    containers: dict[str, str] = field(default_factory=dict)

    @property
    def names(self) -> list[str]:
        return [n.name for n in self.nodes]

    def clustercheck_args(self, names: list[str] | None = None) -> list[str]:
        """`clustercheck run`'s options for these nodes (only NAMES of them, when given)."""
        argv = ["--hosts", self.inventory, *(["--limit", ",".join(names)] if names else [])]
        return [*argv, *(["--ssh-config", self.ssh_config] if self.ssh_config else [])]


def own_nodes(path: str, limit: str | None = None) -> Nodes:
    """The user's own nodes: the inventory (or host list) clustercheck reads, narrowed by LIMIT."""
    try:
        nodes = inventory.load(path, limit)
    except inventory.InventoryError as exc:
        raise BenchmarkError(str(exc)) from exc
    if not nodes:
        raise BenchmarkError(f"no node in {path}" + (f" matches --limit {limit}" if limit else ""))
    return Nodes(path, nodes)


def cluster_name(suffix: str) -> str:
    return os.environ.get("TESTCLUSTER_NAME", "bench") + suffix


@contextlib.contextmanager
def test_cluster(
    size: int,
    suffix: str,
    *,
    reuse: bool,
    keep: bool,
    os_name: str | list[str] = "debian12",
    user: str = "root",
    image: str = "",
    rails: int = 0,
) -> Iterator[Nodes]:
    """SIZE test nodes (OS_NAME: one name for all, or one per node) named $TESTCLUSTER_NAME + SUFFIX: with REUSE
    the ones already up with the same shape, else brought up afresh and taken down afterwards unless KEEP. IMAGE and
    RAILS as testcluster.up's (a node image of its own, data networks besides the cluster's)."""
    name = cluster_name(suffix)
    wanted = [os_name] * size if isinstance(os_name, str) else list(os_name)
    if size > 20:  # systemd in many containers needs more inotify instances than the kernel's default
        raise_limits()
    cluster = None
    if reuse:
        with contextlib.suppress(testcluster.ClusterError, OSError, ValueError):
            found = testcluster.Cluster.load(name)
            running = testcluster.docker("ps", "-q", "--filter", f"label={testcluster.LABEL}={name}").stdout.split()
            same = [n.os for n in found.nodes] == [testcluster.distro(o).os for o in wanted] and found.user == user
            same = same and len(found.rails) == rails
            if same and len(running) == size:
                cluster = found
                say(f"benchmark: reusing the test cluster {name} ({size} nodes)")
    brought_up = cluster is None
    if cluster is None:
        say(f"benchmark: bringing up the test cluster {name}: {size} node(s), {', '.join(sorted(set(wanted)))}")
        try:
            cluster = testcluster.up(size, name=name, os_name=wanted, user=user, image=image, rails=rails)
        except testcluster.ClusterError as exc:
            raise BenchmarkError(f"the test cluster did not come up: {exc}") from exc
    config = Path(cluster.state_dir) / "empty_ssh_config"
    config.touch()
    try:
        yield Nodes(
            cluster.inventory,
            inventory.load(cluster.inventory),
            str(config),
            cluster,
            {n.name: n.container for n in cluster.nodes},
        )
    finally:
        if brought_up and not keep:
            say(f"benchmark: taking {name} down")
            testcluster.down(name)


def raise_limits() -> None:
    from harness import raise_machine_limits

    problems = raise_machine_limits()
    if problems:
        raise BenchmarkError("cannot raise the machine's limits for many nodes: " + "; ".join(problems))


def wheelhouse() -> Path:
    """The torch wheelhouse the test nodes install from (tests/conftest.py builds it)."""
    import conftest

    return conftest.build_wheelhouse()


def install_torch(nodes: Nodes, names: list[str] | None = None) -> None:
    """torch 2.13.0 (CPU) into /opt/clustercheck/venv on NAMES (default all) of the test cluster, recorded as the
    environment's python, as the cluster tests do (tests/cluster/torchenv.py)."""
    import torchenv

    cluster = nodes.cluster
    if names is not None:
        cluster = testcluster.Cluster(**{**asdict(cluster), "nodes": [cluster.node(n) for n in names]})
    errors = torchenv.install(cluster, wheelhouse())
    if errors:
        raise BenchmarkError("installing torch on the test nodes failed: " + "; ".join(errors))


@contextlib.contextmanager
def torch_nodes(args, size: int = 3) -> Iterator[Nodes]:
    """Nodes with torch: --hosts INVENTORY as it is, or SIZE Debian 12 test nodes with torch installed."""
    if args.hosts:
        yield own_nodes(args.hosts)
        return
    with test_cluster(size, "", reuse=args.reuse, keep=args.keep) as nodes:
        install_torch(nodes)
        yield nodes


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
        raise BenchmarkError("clustercheck is not installed (pip install -e . in this checkout)")
    return found


def core_stage(nodes: Nodes, names: list[str], run_dir: Path, *extra: str) -> list[str]:
    """`clustercheck run --only core` on NAMES, as a user runs it, with a JSON report on stdout."""
    argv = [clustercheck_exe(), "run", *nodes.clustercheck_args(names), "--only", "core"]
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


# --------------------------------------------------------------------------- commands over OpenSSH


def ssh_argv(node: inventory.Node, command: str) -> list[str]:
    """`ssh` to NODE as the inventory says (user, port, key, ansible_ssh_common_args options), running COMMAND."""
    argv = ["ssh", "-o", "BatchMode=yes", "-o", "LogLevel=ERROR"]
    if node.port:
        argv += ["-p", str(node.port)]
    if node.key_file:
        argv += ["-i", node.key_file, "-o", "IdentitiesOnly=yes"]
    for key, value in node.ssh_options.items():
        argv += ["-o", f"{key}={value}"]
    target = f"{node.user}@{node.address}" if node.user else node.address
    return [*argv, target, command]


def ssh(node: inventory.Node, command: str, stdin: bytes | None = None, timeout: float = 300) -> str:
    """COMMAND on NODE; its output, or BenchmarkError naming the node."""
    proc = subprocess.run(ssh_argv(node, command), input=stdin, capture_output=True, timeout=timeout)
    if proc.returncode != 0:
        err = (proc.stderr or proc.stdout).decode(errors="replace").strip().splitlines()[-3:]
        raise BenchmarkError(f"{node.name}: `{command[:80]}` failed (exit {proc.returncode}): {' | '.join(err)}")
    return proc.stdout.decode(errors="replace")


def put(node: inventory.Node, data: bytes, path: str) -> None:
    """DATA into PATH on NODE (its directory created), through ssh's standard input."""
    ssh(node, f"mkdir -p {shlex.quote(str(Path(path).parent))} && cat > {shlex.quote(path)}", stdin=data)


def on_every_node(nodes: list[inventory.Node], commands: dict[str, str], timeout: float = 600) -> float:
    """Each node's command (name -> shell line) started at once over ssh, as a person would in one terminal per
    node; the wall time until the last one ended. BenchmarkError names a node whose command failed."""
    started = time.monotonic()
    procs = {
        n.name: subprocess.Popen(ssh_argv(n, commands[n.name]), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        for n in nodes
    }
    outputs = {name: proc.communicate(timeout=timeout)[0] for name, proc in procs.items()}
    elapsed = time.monotonic() - started
    for name, proc in procs.items():
        if proc.returncode != 0:
            tail = outputs[name].decode(errors="replace").strip().splitlines()[-4:]
            raise BenchmarkError(f"{name}: the command failed (exit {proc.returncode}): {' | '.join(tail)}")
    return elapsed


def rss_guard(limit_gib: float) -> None:
    """Stop this process once its resident memory passes LIMIT_GIB (the machine is shared with others)."""
    page = os.sysconf("SC_PAGE_SIZE")

    def watch() -> None:
        while True:
            with contextlib.suppress(OSError, ValueError):
                rss = int(Path("/proc/self/statm").read_text().split()[1]) * page
                if rss > limit_gib * 2**30:
                    print(json.dumps({"error": f"resident memory passed {limit_gib:g} GiB"}), flush=True)
                    os._exit(3)
            time.sleep(0.2)

    threading.Thread(target=watch, daemon=True).start()
