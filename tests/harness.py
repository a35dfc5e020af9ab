"""What the tests share: running clustercheck as a user does, reading its report, reaching test nodes over SSH,
finding leftovers, and the faults the tests put on a node (never through clustercheck's own code).

Importable from every test directory (pytest's pythonpath setting in pyproject.toml names tests/ and
tests/cluster/).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from torchenv import PYTHON, VENV, ssh_client, ssh_run

from clustercheck.checks import collectives, ddp, network
from clustercheck.model import CheckResult
from clustercheck.remote import netprobe

__all__ = ["PYTHON", "VENV", "ssh_client", "ssh_run"]

CLUSTERCHECK = str(Path(sys.executable).parent / "clustercheck")
IN_CI = os.environ.get("CI", "").lower() == "true"

# What any process clustercheck started would show: its marker in the environment, or its work directory.
LEFTOVERS = (
    "for d in /proc/[0-9]*; do grep -qsz '^CLUSTERCHECK_RUN=' $d/environ && cat $d/cmdline | tr '\\0' ' ' && echo; "
    "done; ls -d /tmp/clustercheck-* 2>/dev/null; pgrep -af '[c]lustercheck-remote|[t]orch.distributed.run'; true"
)
SWEEP = (  # what clustercheck's own cleanup does on a node: every process with its run marker, its work directories
    "for d in /proc/[0-9]*; do grep -qsz '^CLUSTERCHECK_RUN=' $d/environ && kill -9 ${d#/proc/}; done; "
    "rm -rf /tmp/clustercheck-*; true"
)
# A node's DDP ranks, not its torchrun agent (whose command line names the worker too).
DDP_RANKS = (
    "for p in $(pgrep -f 'clustercheck-remote[.]pyz stages'); do "
    "grep -qs torch.distributed.run /proc/$p/cmdline || echo $p; done"
)


# A training script that leaves a checkpoint and Lightning's logs beside itself on rank 0, a new log version per run
# as Lightning numbers them: what a later launch's same-code check must not take for code.
RANK_0_WRITES = """
import os
import time
import torch.distributed as dist
dist.init_process_group("gloo")
here = os.path.dirname(os.path.abspath(__file__))
if dist.get_rank() == 0:  # what a training script leaves beside itself: a checkpoint, Lightning's logs
    with open(os.path.join(here, "model.pt"), "w") as fh:
        fh.write(str(time.time()))
    logs = os.path.join(here, "lightning_logs")
    os.makedirs(logs, exist_ok=True)
    version = os.path.join(logs, "version_%d" % len(os.listdir(logs)))  # a new one per run, as Lightning does
    os.makedirs(version)
    with open(os.path.join(version, "hparams.yaml"), "w") as fh:
        fh.write("lr: 0.1\\n")
dist.barrier()
print(f"rank {dist.get_rank()} done", flush=True)
dist.destroy_process_group()
"""


def on(node, command: str, check: bool = True, timeout: float = 180) -> subprocess.CompletedProcess:
    """COMMAND run as root on a test node through Docker (not SSH: what a test does to a node is not clustercheck's)."""
    proc = subprocess.run(
        ["docker", "exec", node.container, "sh", "-c", command], capture_output=True, text=True, timeout=timeout
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"{node.name}: {command}: exit {proc.returncode}: {proc.stdout}{proc.stderr}")
    return proc


def freeze_after_go(
    container: str, node: str, after: float, done: threading.Event, frozen: list[float], *, whole_node: bool = True
) -> None:
    """Freeze NODE AFTER seconds once its network probe has the go signal (its connections and rounds have begun),
    appending the moment to FROZEN; thaw it when DONE is set. WHOLE_NODE: pause CONTAINER (sshd and all, as a
    hung machine); else stop the probe's processes (SIGSTOP) from inside the node, as a hung probe. The go file is
    watched from inside the node, 10 ms apart, and the probe stopped there with no docker round trip in between:
    at 3 nodes its connections and rounds take about a second in all."""
    probe = f"--self [{node[0]}]{node[1:]} "  # a pattern this script's own command line does not match
    tag = f"clustercheck-test-freezer-{node}"
    script = (
        f": {tag}; "
        f"while :; do pid=$(pgrep -n -f -- {shlex.quote(probe)}); "
        "go=$([ -n \"$pid\" ] && tr '\\0' '\\n' < /proc/$pid/cmdline 2>/dev/null | sed -n '/^--go-file$/{n;p;}'); "
        '[ -n "$go" ] && break; sleep 0.05; done; '
        'while [ ! -e "$go" ]; do sleep 0.01; done; '
        f"sleep {after:g}; " + ("" if whole_node else f"pkill -STOP -f -- {shlex.quote(probe)}; ") + "echo go"
    )
    watch = subprocess.Popen(
        ["docker", "exec", container, "timeout", "600", "sh", "-c", script],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    while watch.poll() is None and not done.wait(0.05):
        pass
    if watch.poll() is None:  # the run ended first: stop the watch inside the node too
        subprocess.run(["docker", "exec", container, "pkill", "-f", tag], capture_output=True)
        watch.kill()
        watch.wait()
        return
    if "go" not in watch.stdout.read():
        return
    if whole_node:
        pause(container)
    frozen.append(time.monotonic())
    done.wait()
    if whole_node:
        subprocess.run(["docker", "unpause", container], check=True, capture_output=True)
    else:
        subprocess.run(["docker", "exec", container, "pkill", "-CONT", "-f", "--", probe], capture_output=True)


def pause(container: str, attempts: int = 20) -> None:
    """docker pause CONTAINER, tried again while runc cannot freeze its cgroup ("OCI runtime pause failed: unable to
    freeze": a process being forked, or a machine too loaded for the freezer to settle in time; runc thaws it again
    then); fails the test with Docker's answer when it never takes."""
    for _ in range(attempts):
        proc = subprocess.run(["docker", "pause", container], capture_output=True, text=True, timeout=120)
        if proc.returncode == 0:
            return
        time.sleep(0.25)
    raise AssertionError(f"docker pause {container} did not take in {attempts} attempts: {proc.stderr.strip()}")


def promtool_path() -> str:
    """The path of Prometheus' promtool (Debian's `prometheus` package). Where it is not installed, the test that needs
    it is skipped, saying so; in CI (CI=true, where .ci/run installs it) it fails: CI must run those checks."""
    tool = shutil.which("promtool")
    if not tool:
        missing = "promtool is not installed (apt-get install prometheus; .ci/run installs it)"
        if IN_CI:
            pytest.fail(f"{missing}, and CI must run this check")
        pytest.skip(missing)
    return tool


def run_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """`clustercheck ARGS` as a user runs it."""
    return subprocess.run([CLUSTERCHECK, *args], capture_output=True, text=True, timeout=timeout)


def clustercheck_command(cluster, tmp_path: Path, *args: str) -> list[str]:
    """`clustercheck run` against CLUSTER's inventory, as a user runs it, with no ~/.ssh/config of ours."""
    empty_config = tmp_path / "ssh_config"
    empty_config.touch()
    return [
        CLUSTERCHECK,
        "run",
        "--hosts",
        cluster.inventory,
        "--ssh-config",
        str(empty_config),
        "--run-dir",
        str(tmp_path / "run"),
        *args,
    ]


def clustercheck(cluster, tmp_path: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        clustercheck_command(cluster, tmp_path, *args), capture_output=True, text=True, timeout=timeout
    )


def checks_of(proc: subprocess.CompletedProcess) -> dict[tuple[str, str | None], dict]:
    """(check name, host) -> the check, from a JSON report on stdout."""
    report = json.loads(proc.stdout)
    return {(c["name"], c["host"]): c for c in report["checks"]}


def leftovers(cluster) -> dict[str, str]:
    """Node -> what clustercheck left running or on disk there (empty: nothing)."""
    found = {}
    for node in cluster.nodes:
        with ssh_client(cluster, node) as client:
            _, out = ssh_run(client, LEFTOVERS, timeout=60)
            if out.strip():
                found[node.name] = out.strip()
    return found


# ------------------------------------------------------------------------------------------- recorded results

RECORDS = Path(__file__).parent / "unit" / "records"


def real_results() -> list[CheckResult]:
    """Check results as a three-node run judges them: per-host statuses, a cluster-wide busbw sweep, DDP."""
    records = probe_records("netprobe-node3-firewall.json")
    results = network.evaluate(
        records, [network.Peer(n, r["address"]) for n, r in sorted(records.items())], "node1", 29500
    )
    results += collectives.evaluate_bandwidth(_record("collectives-2x2.json"), world_size=4)
    results.append(ddp.evaluate(_record("ddp-pass.json"), world_size=3))
    return results


def _record(name: str):
    return json.loads((RECORDS / name).read_text())


def probe_records(name_or_records: str | dict[str, dict]) -> dict[str, dict]:
    """The network probe's records as the controller receives them: the recorded records (a file of RECORDS, or
    ones a test altered) are what each node's mesh() measured; the probe prints them through netprobe.summarise."""
    full = _record(name_or_records) if isinstance(name_or_records, str) else name_or_records
    addresses = {name: record["address"] for name, record in full.items()}
    return {name: netprobe.summarise(record, addresses) for name, record in full.items()}


# ------------------------------------------------------------------------------------------- faults

# The site-packages of the environment a node records in /etc/clustercheck/python (where clustercheck finds torch).
RECORDED_SITE_PACKAGES = (
    '"$(cat /etc/clustercheck/python)" -c \'import sysconfig; print(sysconfig.get_paths()["purelib"])\''
)

# Only the multi-node DDP stage, one rank per node, JSON on stdout.
DDP_ONLY = ("--format", "json", "--skip", "local.*", "--only", "ddp", "--nproc-per-node", "1")
LONG_DDP = str(Path(__file__).parent / "cluster" / "clustercheck_long_ddp.py")


# The heartbeat files of the DDP ranks running now (their --out directory), not those an earlier run left.
HEARTBEATS = (
    f"for p in $({DDP_RANKS}); do "
    "d=$(tr '\\0' '\\n' < /proc/$p/cmdline | grep -x -A1 -e --out | tail -n 1); "
    'cat "$d"/heartbeat/rank-*.json; echo; done 2>/dev/null; true'
)


def _heartbeat_steps(client) -> list[int]:
    """The steps the DDP job's ranks on CLIENT's node last reported (their heartbeat files); [] before they beat."""
    try:
        out = ssh_run(client, HEARTBEATS, timeout=60)[1]
    except TimeoutError:  # a busy machine: ask again
        return []
    return [int(step) for step in re.findall(r'"step": (\d+)', out)]


def _running(clients) -> bool:
    """Every node's ranks beat, and the job is past its start: rank 0 trains its single-process reference first (its
    steps count), while the other ranks wait for it."""
    steps = [_heartbeat_steps(client) for client in clients.values()]
    return all(steps) and max(max(s) for s in steps) >= 1


@contextlib.contextmanager
def long_ddp_job(cluster, tmp_path: Path, master_port: int, timeout: int, *extra: str):
    """`clustercheck run --only ddp` (plus EXTRA arguments) with a DDP job that would run for minutes, yielded once
    its ranks train on every node, with an SSH client per node; clustercheck is killed at the end if it still
    runs."""
    command = clustercheck_command(
        cluster, tmp_path, *DDP_ONLY, "--timeout", str(timeout), "--master-port", str(master_port), *extra
    )
    # clustercheck's own command line, with a DDP job that would run for minutes unless something stops it.
    command = [sys.executable, LONG_DDP, "1000000", *command[1:]]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    clients = {node.name: ssh_client(cluster, node) for node in cluster.nodes}
    try:
        # Running, not starting: every node's ranks beat and the job reports steps, so a fault made now is one in
        # the middle of the job, however long torch took to import on a busy machine.
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and proc.poll() is None and not _running(clients):
            time.sleep(0.5)
        assert proc.poll() is None, "clustercheck ended before the DDP job ran on every node"
        assert time.monotonic() < deadline, "the DDP job did not run on every node within 180 s"
        yield proc, clients
    finally:
        if proc.poll() is None:
            proc.kill()
        for client in clients.values():
            client.close()


def diverging_torch(kind: str, rank: int | None = None) -> str:
    """Python source that makes torch on a node train differently, loaded at interpreter start (a sitecustomize
    on PYTHONPATH, or a .pth file in the environment's site-packages): `lr` makes SGD's learning rate 10% larger,
    `data` shifts every torch.randn draw (so seeded data differs), `checkpoint` makes every file torch.load reads
    come back with its first floating-point number changed by 1e-6 (a checkpoint that differs from what was saved).
    Only in torchrun's ranks (RANK set), and only in global rank RANK when given."""
    if kind == "lr":
        patch = """
            import torch.optim
            _init = torch.optim.SGD.__init__
            def __init__(self, params, lr=1e-3, *args, **kwargs):
                _init(self, params, lr * 1.1, *args, **kwargs)
            torch.optim.SGD.__init__ = __init__
        """
    elif kind == "data":
        patch = """
            import torch
            _randn = torch.randn
            def randn(*args, **kwargs):
                return _randn(*args, **kwargs) + 1e-3
            torch.randn = randn
        """
    elif kind == "checkpoint":
        patch = """
            import torch
            _load = torch.load
            def _first_float(value):
                if isinstance(value, torch.Tensor) and value.is_floating_point():
                    return value
                for item in value.values() if isinstance(value, dict) else []:
                    found = _first_float(item)
                    if found is not None:
                        return found
                return None
            def load(*args, **kwargs):
                state = _load(*args, **kwargs)
                _first_float(state).view(-1)[0] += 1e-6
                return state
            torch.load = load
        """
    else:
        raise ValueError(kind)
    only = "" if rank is None else f" and os.environ.get('RANK') == '{rank}'"
    body = textwrap.indent(textwrap.dedent(patch).strip(), "    ")
    return f"import os\nif os.environ.get('RANK') is not None{only}:\n{body}\n"


@contextlib.contextmanager
def torch_fault_on_node(cluster, node, kind: str):
    """DIVERGING_TORCH(KIND) installed into NODE's torch environment (the one /etc/clustercheck/python records: the
    setup roles' on a converged node, torchenv's on the torch cluster) for the duration; removed afterwards."""
    with ssh_client(cluster, node) as client:
        status, site = ssh_run(client, RECORDED_SITE_PACKAGES, timeout=120)
        assert status == 0, f"{node.name}: no recorded environment: {site}"
        site = site.strip()
        with client.open_sftp() as sftp:
            with sftp.open(f"{site}/clustercheck_test_fault.py", "w") as fh:
                fh.write(diverging_torch(kind))
            with sftp.open(f"{site}/clustercheck_test_fault.pth", "w") as fh:
                fh.write("import clustercheck_test_fault\n")
        try:
            yield
        finally:
            ssh_run(client, f"rm -f {site}/clustercheck_test_fault.py {site}/clustercheck_test_fault.pth")


# ------------------------------------------------------------------------------------------- the test machine

# Limits of the one kernel all test nodes share, raised for clusters of many nodes. A real node has a kernel of
# its own; here every container's systemd takes inotify instances (128 by default: about 22 nodes), and every
# node's ARP entries for every other node count against one neighbour table (gc_thresh3 1024 by default: 64
# nodes need 64 * 63 entries, and beyond the limit ARP fails, which reads as packets dropped by a firewall).
MACHINE_LIMITS = {
    "fs/inotify/max_user_instances": 8192,
    "net/ipv4/neigh/default/gc_thresh1": 4096,
    "net/ipv4/neigh/default/gc_thresh2": 16384,
    "net/ipv4/neigh/default/gc_thresh3": 32768,
}


def raise_machine_limits(limits: dict[str, int] = MACHINE_LIMITS) -> list[str]:
    """Raise the test machine's kernel limits to at least LIMITS (never lowers one); returns what could not be
    raised (not root), for the caller to fail with."""
    problems = []
    for key, value in limits.items():
        path = Path("/proc/sys") / key
        try:
            if int(path.read_text().split()[0]) < value:
                path.write_text(f"{value}\n")
        except OSError as exc:
            problems.append(f"{key}: {exc.strerror or exc}")
    return problems
