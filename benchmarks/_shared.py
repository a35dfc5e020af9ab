"""What the DDP-overhead, bandwidth and setup benchmarks share: their nodes (the Docker test cluster by default, or
the user's own with --hosts INVENTORY), commands started on every node at once over OpenSSH as a person would,
the machine's description, medians, and the JSON output.

The test cluster comes from the test suite's own machinery (tests/cluster/testcluster.py, tests/cluster/torchenv.py,
tests/conftest.py), under the name TESTCLUSTER_NAME (default "bench") plus a suffix per kind of cluster; it is
removed afterwards unless --keep is given, and with --reuse the one already up is measured.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
for _path in (REPO / "tests", REPO / "tests" / "cluster"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from clustercheck import inventory  # noqa: E402


class BenchmarkError(RuntimeError):
    """A benchmark that could not measure (a node unreachable, a job that failed); printed as one line."""


def parser(description: str, repeat: int) -> argparse.ArgumentParser:
    """The options every benchmark takes."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--hosts", metavar="INVENTORY", help="your own nodes (an Ansible inventory); default: test nodes")
    p.add_argument(
        "--rounds", dest="repeat", metavar="N", type=int, default=repeat, help=f"rounds; medians (default {repeat})"
    )
    p.add_argument("--json", metavar="FILE", help="also write the figures as JSON to FILE")
    p.add_argument("--keep", dest="keep_cluster", action="store_true", help="leave the test cluster up")
    p.add_argument("--reuse", action="store_true", help="measure the test cluster already up under the same name")
    return p


def machine() -> dict:
    """The control machine: cores, CPU model and load average, recorded beside every figure."""
    model = ""
    with contextlib.suppress(OSError):
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        model = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "")
    return {
        "nproc": os.cpu_count(),
        "cpu": model or platform.processor(),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def median(values: list[float]) -> float:
    return statistics.median(values)


def write_json(path: str | None, doc: dict) -> None:
    if path:
        Path(path).write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
        print(f"figures written to {path}")


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- the nodes


@dataclass
class Nodes:
    """The nodes a benchmark runs on: an inventory clustercheck reads, and the same nodes for OpenSSH."""

    inventory: str
    nodes: list[inventory.Node]
    ssh_config: str | None = None  # --ssh-config for clustercheck (an empty file on the test cluster)
    cluster: object | None = None  # the test cluster, when it is one
    extra: dict = field(default_factory=dict)

    def clustercheck_args(self) -> list[str]:
        return ["--hosts", self.inventory, *(["--ssh-config", self.ssh_config] if self.ssh_config else [])]


def _cluster_name(suffix: str) -> str:
    return os.environ.get("TESTCLUSTER_NAME", "bench") + suffix


@contextlib.contextmanager
def test_cluster(
    args, size: int, suffix: str = "", os_name="debian12", user: str = "root", reuse: bool = True
) -> Iterator[object]:
    """SIZE test nodes under TESTCLUSTER_NAME + SUFFIX: with --reuse (and REUSE) the ones already up with the same
    shape, else started afresh; removed at the end unless --keep."""
    import testcluster

    name = _cluster_name(suffix)
    wanted = [os_name] * size if isinstance(os_name, str) else list(os_name)
    cluster = None
    with contextlib.suppress(testcluster.ClusterError, OSError, ValueError):
        if not (reuse and args.reuse):
            raise ValueError("start afresh")
        found = testcluster.Cluster.load(name)
        running = testcluster.docker("ps", "-q", "--filter", f"label={testcluster.LABEL}={name}").stdout.split()
        same = [n.os for n in found.nodes] == [testcluster.distro(o).os for o in wanted] and found.user == user
        if same and len(running) == size:
            cluster = found
            say(f"reusing the test cluster {name} ({size} nodes)")
    if cluster is None:
        say(f"starting the test cluster {name}: {size} node(s), {', '.join(wanted)}")
        try:
            cluster = testcluster.up(size, name=name, os_name=wanted, user=user)
        except testcluster.ClusterError as exc:
            raise BenchmarkError(f"the test cluster did not come up: {exc}") from exc
    try:
        yield cluster
    finally:
        if not args.keep_cluster:
            say(f"removing the test cluster {name}")
            testcluster.down(name)


def wheelhouse() -> Path:
    """The torch wheelhouse the test nodes install from (tests/conftest.py builds it)."""
    import conftest

    return conftest.build_wheelhouse()


@contextlib.contextmanager
def torch_nodes(args, size: int = 3) -> Iterator[Nodes]:
    """Nodes with torch: --hosts INVENTORY as it is, or SIZE Debian 12 test nodes with torch 2.13.0 (CPU) in the
    environment clustercheck finds (tests/cluster/torchenv.py, as the cluster tests do)."""
    if args.hosts:
        yield Nodes(args.hosts, inventory.load(args.hosts))
        return
    import torchenv

    with test_cluster(args, size) as cluster:
        errors = torchenv.install(cluster, wheelhouse())
        if errors:
            raise BenchmarkError("installing torch on the test nodes failed: " + "; ".join(errors))
        empty = Path(cluster.state_dir) / "empty_ssh_config"
        empty.touch()
        yield Nodes(cluster.inventory, inventory.load(cluster.inventory), str(empty), cluster)


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
