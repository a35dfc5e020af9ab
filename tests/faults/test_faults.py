"""The fault suite: every row of rows.ROWS put on the 3-node test cluster for real (through Docker, or as root on
the node: never through clustercheck's own code), `clustercheck run` run as a user runs it, and the contract
asserted: the exit code, a FAIL or ERROR naming the node or pair and the cause, its fix, the other nodes' results
kept, the verdict within the row's deadline, and nothing of clustercheck's left on any node.

The rows that need what site.yml sets up (`Fault.site`: its firewall, chrony, Slurm, the names in /etc/hosts, the
rails) run one after the other on the converged cluster; the others on the torch cluster (torch in the recorded
environment and nothing of site.yml, as a site without our playbook has it), so that each cluster's tests stay in
one lane and the two lanes share the rows. Each row restores its node before the next, and after every row the nodes
are compared with how they were before the first (`put_back`): a row that left one changed fails, and spoils the
cluster for every later test, instead of changing what they run on. What each row saw is recorded in
tests/faults/last-run.json, from which scripts/faults_docs.py renders docs/faults.md.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import shlex
import signal
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import spoil
from fault_rows import ROWS, Fault
from harness import (
    DDP_RANKS,
    LEFTOVERS,
    RECORDED_SITE_PACKAGES,
    SWEEP,
    clustercheck,
    clustercheck_command,
    leftovers,
    long_ddp_job,
    pause,
    ssh_client,
    ssh_run,
    torch_fault_on_node,
)

pytestmark = pytest.mark.cluster
RESULTS = Path(__file__).parent / "last-run.json"
FAILED = ("FAIL", "ERROR")


@dataclass
class Verdict:
    """What one run of clustercheck answered, and how long it took to (from the start, or from a mid-run fault)."""

    returncode: int
    stdout: str
    stderr: str
    seconds: float

    @property
    def report(self) -> dict | None:
        try:
            return json.loads(self.stdout)
        except ValueError:
            return None


def _for_the_rows(cluster):
    """CLUSTER with the environment's python and site-packages /etc/clustercheck/python records (`python`,
    `site_packages`), and what a row may change on its nodes recorded for `put_back`."""
    node1 = cluster.nodes[0]
    cluster.python = on_node(node1, "cat /etc/clustercheck/python").strip()
    cluster.site_packages = on_node(node1, RECORDED_SITE_PACKAGES).strip()
    cluster.before_the_rows = node_states(cluster)
    return cluster


@pytest.fixture(scope="module")
def site_faults(converged_cluster):
    """The cluster after site.yml (chrony, /etc/hosts, ufw, SSH trust, Slurm, the rails, torch in its environment)."""
    return _for_the_rows(converged_cluster)


@pytest.fixture(scope="module")
def torch_faults(torch_cluster):
    """The cluster with torch in the recorded environment and nothing of site.yml."""
    return _for_the_rows(torch_cluster)


INJECT: dict[str, Callable] = {}


def injects(row_id: str):
    def register(function):
        INJECT[row_id] = function
        return function

    return register


SITE_ROWS = [r for r in ROWS if r.site]
TORCH_ROWS = [r for r in ROWS if not r.site]


@pytest.mark.parametrize("row", TORCH_ROWS, ids=[r.id for r in TORCH_ROWS])
def test_fault(row: Fault, torch_faults, tmp_path):
    _row(row, torch_faults, tmp_path)


@pytest.mark.parametrize("row", SITE_ROWS, ids=[r.id for r in SITE_ROWS])
def test_fault_after_site_yml(row: Fault, site_faults, tmp_path):
    _row(row, site_faults, tmp_path)


def _row(row: Fault, cluster, tmp_path: Path) -> None:
    try:
        verdict = INJECT[row.id](cluster, tmp_path, row)
    finally:
        put_back(cluster, row)
    said = _assert_contract(row, verdict, cluster)
    assert leftovers(cluster) == {}, "clustercheck left processes or work directories on a node"
    _record(row, verdict, said)


def test_a_row_that_leaves_a_node_changed_fails_and_spoils_the_cluster(torch_faults, monkeypatch):
    """What `put_back` does after a row whose restore did not work: here, a line left in node2's /etc/hosts."""
    monkeypatch.setitem(globals(), "SETTLE", 0)
    row = Fault("leaves-hosts", "", "", 0, "", "node2", "", 0)
    node2 = torch_faults.node("node2")
    on_node(node2, "echo '192.0.2.1 leftover' >> /etc/hosts")
    try:
        with pytest.raises(AssertionError) as raised:
            put_back(torch_faults, row)
    finally:  # Docker bind-mounts /etc/hosts: rewritten in place
        kept = "grep -v ' leftover$' /etc/hosts > /root/hosts.faults"
        on_node(node2, f"{kept} && cat /root/hosts.faults > /etc/hosts && rm /root/hosts.faults")
    said = "the fault row leaves-hosts did not put the cluster back: node2: +192.0.2.1 leftover"
    assert str(raised.value) == torch_faults.spoiled == said
    put_back(torch_faults, row)  # as before the rows again: nothing to say
    del torch_faults.spoiled  # what spoiled it is undone


def test_every_row_has_an_injection():
    assert sorted(INJECT) == sorted(r.id for r in ROWS)


# ------------------------------------------------------------------------------------------- the nodes put back

# What a node keeps running of clustercheck's (LEFTOVERS without the work directory, which only a later run or the
# operator removes from a node that could not be reached).
PROCESSES = LEFTOVERS.replace("ls -d /tmp/clustercheck-* 2>/dev/null; ", "")


def node_state(site_packages: str) -> str:
    """What the rows change on a node and put back (files, services, firewall rules, the link's queueing, mounts, the
    torch environment in SITE_PACKAGES), and what a row that went wrong leaves running."""
    return "; ".join(
        [
            "cat /etc/hosts",
            "md5sum /root/.ssh/authorized_keys /root/.bashrc /etc/ssh/ssh_host_*_key.pub 2>&1",
            "md5sum /etc/slurm/slurm.conf /etc/chrony/chrony.conf 2>&1",
            "ls /etc/ssh/sshd_config.d",
            "systemctl is-active ssh chrony slurmd",
            "iptables -S",
            "tc qdisc show",  # every interface's: the cluster network's and the rails'
            "df -k --output=target,size /dev/shm /tmp /root",
            f"md5sum {site_packages}/torch/version.py {site_packages}/mpmath-*.dist-info/METADATA 2>&1",
            f"ls {site_packages} | grep clustercheck_test_fault",
            PROCESSES,
        ]
    )


SETTLE = 60  # seconds a node restarted by a row (node-down) may take to have its services back


def node_states(cluster) -> dict[str, str]:
    """Node -> its container's state, whether SSH lets the suite in with the cluster's key and known_hosts, and what
    `node_state` shows there; and the control machine's known_hosts."""

    def state(node) -> str:
        container = docker("inspect", "--format", "running={{.State.Running}} paused={{.State.Paused}}", node.container)
        try:
            with ssh_client(cluster, node) as client:
                ssh = ssh_run(client, "hostname", timeout=30)[1].strip()
        except Exception as exc:
            ssh = f"refused: {type(exc).__name__}"
        shown = on_node(node, node_state(cluster.site_packages), check=False) if "paused=false" in container else ""
        return f"{container.strip()}\nssh: {ssh}\n{shown}"

    with ThreadPoolExecutor(len(cluster.nodes)) as pool:
        states = dict(zip([n.name for n in cluster.nodes], pool.map(state, cluster.nodes), strict=True))
    states["known_hosts"] = Path(cluster.known_hosts).read_text()
    return states


def put_back(cluster, row: Fault) -> None:
    """After ROW: every node as it was before the first row. One that is not (within SETTLE seconds) fails the row
    and spoils the cluster, naming the row and what it left."""
    deadline = time.monotonic() + SETTLE
    while (now := node_states(cluster)) != cluster.before_the_rows and time.monotonic() < deadline:
        time.sleep(2)
    if now == cluster.before_the_rows:
        return
    left = []
    for name, before in cluster.before_the_rows.items():
        if now[name] != before:
            gone = [f"-{line}" for line in before.splitlines() if line not in now[name].splitlines()]
            came = [f"+{line}" for line in now[name].splitlines() if line not in before.splitlines()]
            left.append(f"{name}: {' '.join([*gone, *came][:8])}")
    why = f"the fault row {row.id} did not put the cluster back: {'; '.join(left)}"
    spoil(cluster, why)
    raise AssertionError(why)


# ------------------------------------------------------------------------------------------- the contract


def _assert_contract(row: Fault, verdict: Verdict, cluster) -> str:
    """The row's contract on VERDICT; returns the first line of what clustercheck said."""
    output = verdict.stderr[-3000:]
    assert verdict.returncode == row.exit_code, f"exit {verdict.returncode}, expected {row.exit_code}:\n{output}"
    assert "Traceback" not in verdict.stderr, output
    busy = 0.0 if row.mid_run else _quickest_facts(verdict.report)
    assert verdict.seconds <= row.deadline + busy, (
        f"the verdict took {verdict.seconds:.1f} s (deadline {row.deadline} s beyond the {busy:.1f} s the quickest "
        "node's facts took)"
    )
    if not row.check:  # interrupted, or stopped before any node was contacted: no report, the closing line says so
        closing = ("clustercheck: interrupted", "clustercheck: error:")
        said = next((ln for ln in verdict.stderr.splitlines() if ln.startswith(closing)), "")
        assert re.search(row.cause, said), output
        return said
    report = verdict.report
    assert report is not None, f"no JSON report:\n{output}"
    finding = _finding(report, row)
    said = finding["message"].splitlines()[0]
    assert re.search(row.cause, said), f"{said!r} does not match {row.cause!r}"
    assert finding["remediation"] or finding["status"] == "PASS", f"{row.check} gives no fix: {finding}"
    for node in cluster.nodes:  # the other nodes' results are kept, and pass
        if row.faulty in ("all", node.name):
            continue
        theirs = [c for c in report["checks"] if c["host"] == node.name]
        assert any(c["name"] == "connect" and c["status"] == "PASS" for c in theirs), f"{node.name}: {theirs[:3]}"
        failed = [
            f"{c['name']}: {c['message']}"
            for c in theirs
            if c["status"] in FAILED and not (c["name"] == row.check and row.faulty in c["message"])
        ]
        assert not failed, f"{node.name} has no fault, yet: {failed}"
    return said


def _quickest_facts(report: dict | None) -> float:
    """Seconds the quickest node took to collect its facts: what this machine's load cost every node alike, which a
    fault on one node cannot lengthen. The deadline bounds what the fault adds beyond it (a timeout, a retry, a
    wait on the faulty node): on a quiet machine a node's facts take 2 to 5 s; one CI run, beside a converge of
    three Ubuntu releases, saw 43 s on a healthy node."""
    seconds = [
        (c.get("data") or {}).get("seconds")
        for c in (report or {}).get("checks", [])
        if c["name"] == "facts" and c["status"] == "PASS"
    ]
    return min((s for s in seconds if isinstance(s, int | float)), default=0.0)


def _finding(report: dict, row: Fault) -> dict:
    """The FAIL or ERROR (ROW.statuses) of ROW's check that names ROW's node, pair or the cluster."""
    for c in report["checks"]:
        if c["name"] != row.check or c["status"] not in row.statuses:
            continue
        data = c.get("data") or {}
        if (
            c["host"] == row.where
            or (row.where == "cluster" and c["host"] is None)
            or f"{data.get('from')} -> {data.get('to')}" == row.where
        ):
            return c
    found = [(c["name"], c["host"], c["status"], c["message"][:200]) for c in report["checks"] if c["status"] in FAILED]
    mine = [(c["host"], c["status"], c["message"][:200]) for c in report["checks"] if c["name"] == row.check]
    raise AssertionError(f"no {row.check} {'/'.join(row.statuses)} for {row.where}: {mine}; failures: {found}")


def _record(row: Fault, verdict: Verdict, said: str) -> None:
    """ROW's observation into last-run.json (rows run alone update their own entry)."""
    try:
        recorded = json.loads(RESULTS.read_text())
    except (OSError, ValueError):
        recorded = {}
    recorded[row.id] = {
        "said": said,
        "exit_code": verdict.returncode,
        "seconds": round(verdict.seconds, 1),
        "recorded_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }
    RESULTS.write_text(json.dumps(recorded, indent=2, sort_keys=True) + "\n")


# ------------------------------------------------------------------------------------------- running clustercheck


def run(cluster, tmp_path: Path, row: Fault, *extra: str, command: list[str] | None = None) -> Verdict:
    """`clustercheck run ROW.args EXTRA --format json` as a user runs it, timed from its start."""
    command = command or clustercheck_command(cluster, tmp_path, *row.args, *extra, "--format", "json")
    started = time.monotonic()
    proc = subprocess.run(command, capture_output=True, text=True, timeout=row.deadline + 120)
    return Verdict(proc.returncode, proc.stdout, proc.stderr, time.monotonic() - started)


def docker(*args: str, check: bool = True) -> str:
    proc = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=120)
    assert not check or proc.returncode == 0, f"docker {' '.join(args)}: {proc.stderr}"
    return proc.stdout


def on_node(node, script: str, check: bool = True, input: str | None = None) -> str:
    """SCRIPT as root on NODE, through Docker (works whatever state its sshd is in)."""
    proc = subprocess.run(
        ["docker", "exec", "-i", node.container, "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        input=input or "",
    )
    assert not check or proc.returncode == 0, f"{node.name}: {script}: {proc.stdout}{proc.stderr}"
    return proc.stdout


def in_mount_namespace(node, *argv: str) -> None:
    """ARGV as root in NODE's mount namespace, with the capabilities root has on a real machine (mount): what an
    unprivileged container's own root may not do."""
    pid = docker("inspect", "--format", "{{.State.Pid}}", node.container).strip()
    proc = subprocess.run(["nsenter", "--target", pid, "--mount", "--", *argv], capture_output=True, text=True)
    assert proc.returncode == 0, f"{node.name}: {' '.join(argv)}: {proc.stderr}"


def wait_for_ssh(cluster, node, seconds: float = 90) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            with ssh_client(cluster, node) as client:
                if ssh_run(client, "hostname", timeout=20)[1].strip() == node.name:
                    return
        except Exception:
            if time.monotonic() > deadline:
                raise
        time.sleep(1)


def checks(verdict: Verdict) -> dict[tuple[str, str | None], dict]:
    return {(c["name"], c["host"]): c for c in verdict.report["checks"]}


# ------------------------------------------------------------------------------------------- the rows


@injects("node-down")
def node_down(cluster, tmp_path, row):
    node2 = cluster.node("node2")
    hosts = on_node(node2, "cat /etc/hosts")  # Docker writes its own at start: the playbook's entries come back
    docker("kill", node2.container)
    try:
        verdict = run(cluster, tmp_path, row)
    finally:
        docker("start", node2.container)
        on_node(node2, "cat > /etc/hosts", input=hosts)  # in place: Docker bind-mounts it
        on_node(node2, "systemctl reset-failed ssh; systemctl start ssh", check=False)
        wait_for_ssh(cluster, node2)
    found = checks(verdict)
    for name in ("node1", "node3"):
        assert found[("facts", name)]["status"] == "PASS"
        assert found[("torch.import", name)]["status"] == "PASS"
    assert found[("consistency.torch", None)]["status"] == "PASS"  # compared over the nodes that answered
    for name in ("network.tcp", "allreduce", "ddp_equivalence"):  # no multi-node job without every node
        skipped = found[(name, None)]
        assert skipped["status"] == "SKIP" and "node2: not reached" in skipped["message"], skipped
    return verdict


@injects("sshd-hung")
def sshd_hung(cluster, tmp_path, row):
    node2 = cluster.node("node2")
    on_node(node2, "kill -STOP $(cat /run/sshd.pid)")
    try:
        verdict = run(cluster, tmp_path, row)
    finally:
        on_node(node2, "kill -CONT $(cat /run/sshd.pid)")
    assert ("facts", "node2") not in checks(verdict)
    return verdict


@injects("key-refused")
def key_refused(cluster, tmp_path, row):
    node2 = cluster.node("node2")
    on_node(node2, "mv /root/.ssh/authorized_keys /root/.ssh/authorized_keys.faults")
    try:
        verdict = run(cluster, tmp_path, row)
    finally:
        on_node(node2, "mv /root/.ssh/authorized_keys.faults /root/.ssh/authorized_keys")
    return verdict


@injects("host-key-changed")
def host_key_changed(cluster, tmp_path, row):
    node2 = cluster.node("node2")
    restart = "systemctl reset-failed ssh; systemctl restart ssh"
    on_node(
        node2,
        f"mkdir -p /root/hostkeys.faults && mv /etc/ssh/ssh_host_* /root/hostkeys.faults/ && "
        f"ssh-keygen -A >/dev/null && {restart}",
    )
    try:
        # --accept-new-host-keys: new keys may be recorded, a changed one never is.
        known_hosts = Path(cluster.known_hosts)
        before = known_hosts.read_text()
        verdict = run(cluster, tmp_path, row, "--known-hosts", cluster.known_hosts)
        assert known_hosts.read_text() == before
    finally:
        on_node(
            node2,
            f"rm -f /etc/ssh/ssh_host_* && mv /root/hostkeys.faults/* /etc/ssh/ && "
            f"rmdir /root/hostkeys.faults && {restart}",
        )
        wait_for_ssh(cluster, node2)
    connect = checks(verdict)[("connect", "node2")]
    assert connect["data"]["host_key"] and "SHA256:" in connect["message"]
    assert ("facts", "node2") not in checks(verdict)  # nothing ran on a host we could not authenticate
    return verdict


CHAIN = "CLUSTERCHECK-FAULTS"


@injects("firewall")
def firewall(cluster, tmp_path, row):
    node3 = cluster.node("node3")
    sources = ",".join(n.address for n in cluster.nodes if n.name != "node3")
    on_node(
        node3,
        "command -v iptables >/dev/null || (apt-get update -qq && "
        "DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends iptables >/dev/null)",
    )
    on_node(
        node3,
        f"iptables -N {CHAIN} && iptables -I INPUT -j {CHAIN} && "
        f"iptables -A {CHAIN} -s {sources} -p tcp ! --dport 22 -j DROP && "
        f"iptables -A {CHAIN} -s {sources} ! -p tcp -j DROP",
    )
    try:
        verdict = run(cluster, tmp_path, row, "--master-port", "29651")
    finally:
        on_node(node3, f"iptables -D INPUT -j {CHAIN}; iptables -F {CHAIN}; iptables -X {CHAIN}", check=False)
    assert CHAIN not in on_node(node3, "iptables -S")  # restored
    failures = [c for c in verdict.report["checks"] if c["name"] == "network.tcp" and c["status"] == "FAIL"]
    # Every pair with node3, both ways (its replies are dropped too), and no other pair.
    pairs = [("node1", "node3"), ("node2", "node3"), ("node3", "node1"), ("node3", "node2")]
    assert sorted((c["data"]["from"], c["data"]["to"]) for c in failures) == pairs
    for c in failures:
        assert c["message"].startswith(f"{c['data']['from']} -> {c['data']['to']}") and c["data"]["cause"] == "firewall"
    assert "no node reaches node3" in _finding(verdict.report, row)["message"]
    for node in cluster.nodes:  # no torchrun was started anywhere: no command, no log came back
        host_dir = tmp_path / "run" / "hosts" / node.name
        assert (host_dir / "network.json").exists()
        assert not list(host_dir.glob("*.command")) and not (host_dir / "torch").exists()
    return verdict


@injects("hostname-loopback")
def hostname_loopback(cluster, tmp_path, row):
    node2 = cluster.node("node2")
    # Docker bind-mounts /etc/hosts: rewritten in place, never replaced.
    on_node(
        node2,
        "cp /etc/hosts /root/hosts.faults && "
        "sed 's/^[0-9.]*\\([[:space:]].*\\bnode2\\b\\)/127.0.1.1\\1/' /root/hosts.faults > /etc/hosts",
    )
    assert "127.0.1.1" in on_node(node2, "getent hosts node2")
    try:
        verdict = run(cluster, tmp_path, row)
    finally:
        on_node(node2, "cat /root/hosts.faults > /etc/hosts && rm /root/hosts.faults")
    assert "127.0.1.1" not in on_node(node2, "getent hosts node2")
    return verdict


@injects("torch-version")
def torch_version(cluster, tmp_path, row):
    """node3's torch is relabelled 2.12.0 (torch/version.py edited, the build itself unchanged)."""
    node3 = cluster.node("node3")
    python = cluster.python
    torch_dir = on_node(node3, f"{python} -c 'import torch, os; print(os.path.dirname(torch.__file__))'").strip()
    version_py = f"{torch_dir}/version.py"
    # The label changes, not its length: drop the bytecode so Python cannot reuse a stale copy.
    no_pyc = f"rm -f {torch_dir}/__pycache__/version.*.pyc"
    on_node(
        node3, f"cp -p {version_py} {version_py}.orig && sed -i 's/2\\.13\\.0+cpu/2.12.0+cpu/' {version_py} && {no_pyc}"
    )
    try:
        verdict = run(cluster, tmp_path, row)
    finally:
        on_node(node3, f"mv {version_py}.orig {version_py} && {no_pyc}")
    assert on_node(node3, f"{python} -c 'import torch; print(torch.__version__)'").strip() == "2.13.0+cpu"
    result = checks(verdict)[("consistency.torch", None)]
    assert result["message"] == "torch version differs: node3 has 2.12.0+cpu, where the other 2 node(s) have 2.13.0+cpu"
    assert result["data"]["differ"] == ["node3"]
    assert "NOT READY" in verdict.stderr
    return verdict


@injects("rank-killed")
def rank_killed(cluster, tmp_path, row):
    timeout = 150
    with long_ddp_job(cluster, tmp_path, 29661, timeout) as (proc, clients):
        killed_at = time.monotonic()
        _, out = ssh_run(clients["node2"], f"for p in $({DDP_RANKS}); do kill -9 $p && echo killed $p; done")
        assert "killed" in out, out
        stdout, stderr = proc.communicate(timeout=timeout + 60)
        verdict = Verdict(proc.returncode, stdout, stderr, time.monotonic() - killed_at)
    ddp = checks(verdict)[("ddp_equivalence", None)]
    assert ddp["data"]["first_failed_node"] == "node2", ddp
    assert "every node's job was stopped" in ddp["message"]
    assert ddp["data"]["error_lines"]
    return verdict


@injects("ddp-divergence")
def ddp_divergence(cluster, tmp_path, row):
    """node3's torch environment trains with a 10% larger learning rate (a module loaded at interpreter start from
    its site-packages, as a patched or broken library would be): seen only by the ranks on node3."""
    with torch_fault_on_node(cluster, cluster.node("node3"), "lr"):
        verdict = run(cluster, tmp_path, row)
    found = checks(verdict)
    ddp = found[("ddp_equivalence", None)]
    assert ddp["data"]["world_size"] == 3 and ddp["data"]["backend"] == "gloo"
    assert ddp["data"]["max_abs_param_diff"] > 1e-6
    assert found[("network.tcp", None)]["status"] == "SKIP"  # --only ddp
    return verdict


@injects("chrony-stopped")
def chrony_stopped(cluster, tmp_path, row):
    node2 = cluster.node("node2")
    on_node(node2, "systemctl stop chrony")
    try:
        verdict = run(cluster, tmp_path, row)
    finally:
        on_node(node2, "systemctl start chrony")
    sync = checks(verdict)[("time.sync", "node2")]  # the base role sets chrony up: its line puts it right
    assert sync["fix_command"] == shlex.join(
        ["ansible-playbook", "site.yml", "-i", cluster.inventory, "--limit", "node2", "--tags", "base"]
    )
    return verdict


@injects("shm-64m")
def shm_64m(cluster, tmp_path, row):
    node3 = cluster.node("node3")
    in_mount_namespace(node3, "mount", "-o", "remount,size=64m", "/dev/shm")
    try:
        verdict = run(cluster, tmp_path, row)
    finally:
        in_mount_namespace(node3, "mount", "-o", "remount,size=1g", "/dev/shm")
    assert checks(verdict)[("shm.size", "node3")]["data"]["total_bytes"] == 64 << 20
    return verdict


@injects("tmp-small")
def tmp_small(cluster, tmp_path, row):
    node3 = cluster.node("node3")
    in_mount_namespace(node3, "mount", "-t", "tmpfs", "-o", "size=32m,mode=1777", "tmpfs", "/tmp")
    try:
        verdict = run(cluster, tmp_path, row)
    finally:
        in_mount_namespace(node3, "umount", "/tmp")
    return verdict


STALL = 30  # --stall-timeout: a rank's start on a busy 2-core machine can go 20 s without a heartbeat
DDP_DEADLINE = 90  # --timeout: the DDP job's deadline (its start on a busy machine included)
NODE_GRACE, KILL_AFTER = 30, 10  # transport's: how long after its deadline a command on a node ends by itself


@injects("node-frozen")
def node_frozen(cluster, tmp_path, row):
    """node2 frozen during the DDP job (its container paused, as a machine that stops answering): named alone by the
    progress watchdog, the other nodes cleaned up, and nothing of clustercheck's left running on node2 once it is
    back and its job's deadline has passed."""
    node2 = cluster.node("node2")
    extra = ("--stall-timeout", str(STALL))
    with long_ddp_job(cluster, tmp_path, 29701, DDP_DEADLINE, *extra) as (proc, clients):
        time.sleep(6)  # a heartbeat poll (every 5 s) has seen node2's ranks train
        pause(node2.container)
        frozen_at = time.monotonic()
        try:
            stdout, stderr = proc.communicate(timeout=300)
            verdict = Verdict(proc.returncode, stdout, stderr, time.monotonic() - frozen_at)
        finally:
            docker("unpause", node2.container, check=False)
        others = {
            name: ssh_run(client, PROCESSES + "; ls -d /tmp/clustercheck-* 2>/dev/null; true", timeout=60)[1]
            for name, client in clients.items()
            if name != "node2"
        }
    ddp = checks(verdict)[("ddp_equivalence", None)]
    assert ddp["data"]["stalled_nodes"] == ["node2"], ddp["message"]
    assert ddp["data"]["progress"]["node2"]["last_seen_s"] < STALL + 10, ddp["message"]
    assert "node1" not in ddp["message"].split("; the other nodes")[0]
    assert "could not stop the processes started on node2" in stderr, stderr[-2000:]
    assert "node1" not in stderr.split("could not stop")[-1] and "node3" not in stderr.split("could not stop")[-1]
    assert others == {"node1": "", "node3": ""}  # the nodes that answered were cleaned up, work directories too

    # node2 is back: what clustercheck started there ends by itself once the job's deadline (and its grace) passed.
    with ssh_client(cluster, node2) as client:
        try:
            deadline = frozen_at + DDP_DEADLINE + NODE_GRACE + KILL_AFTER + 30
            left = ssh_run(client, PROCESSES, timeout=60)[1].strip()
            while left and time.monotonic() < deadline:
                time.sleep(2)
                left = ssh_run(client, PROCESSES, timeout=60)[1].strip()
            assert left == "", f"still running on node2 after the job's deadline:\n{left}"
            # Its work directory is left: the next run removes it once the frozen run's recorded deadline passed,
            # and says so.
            workdir = f"/tmp/clustercheck-{json.loads(verdict.stdout)['run_id']}"
            until = int(ssh_run(client, f"cat {workdir}/.until", timeout=60)[1].strip())
            time.sleep(max(0.0, until - time.time() + 1))  # the nodes share this machine's clock
            (tmp_path / "next").mkdir()
            after = clustercheck(cluster, tmp_path / "next", "--only", "core", "--skip", "local.*", "--format", "json")
            found = {(c["name"], c["host"]): c for c in json.loads(after.stdout)["checks"]}[("leftovers", "node2")]
            assert found["status"] == "WARN" and workdir in found["message"], found
            assert ssh_run(client, f"ls -d {workdir} 2>/dev/null; true", timeout=60)[1].strip() == ""
        finally:
            ssh_run(client, "rm -rf /tmp/clustercheck-*")  # whatever a failed assertion left
    return verdict


def _frozen_at_the_moment(cluster, tmp_path, row, moment: Callable[[], bool]) -> Verdict:
    """`clustercheck run ROW.args` with node2 paused as soon as MOMENT() is true, timed from the pause; node2 is
    unpaused after the verdict, and what the run left there removed by hand (the frozen-node row shows it ends by
    itself at its deadline: waiting for that here would cost minutes per row)."""
    node2 = cluster.node("node2")
    command = clustercheck_command(cluster, tmp_path, *row.args, "--format", "json")
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 180
        while not moment():
            assert proc.poll() is None, f"clustercheck ended before the moment to freeze node2:\n{proc.stderr.read()}"
            assert time.monotonic() < deadline, "the moment to freeze node2 did not come within 180 s"
            time.sleep(0.05)
        pause(node2.container)
        assert _paused(node2), "docker pause of node2 did not take"
        frozen_at = time.monotonic()
        try:
            stdout, stderr = proc.communicate(timeout=row.deadline + 120)
            verdict = Verdict(proc.returncode, stdout, stderr, time.monotonic() - frozen_at)
        finally:
            docker("unpause", node2.container, check=False)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    on_node(node2, SWEEP)
    assert "could not stop the processes started on node2" in verdict.stderr, verdict.stderr[-2000:]
    return verdict


def _paused(node) -> bool:
    return docker("inspect", "--format", "{{.State.Paused}}", node.container).strip() == "true"


@injects("node-frozen-start")
def node_frozen_start(cluster, tmp_path, row):
    """node2 frozen once its torchrun agent runs, before its ranks start: the other nodes' agents wait for it in the
    rendezvous, so no rank beats anywhere; only node2's silence tells."""
    node2 = cluster.node("node2")

    def torchrun_runs() -> bool:
        return bool(on_node(node2, "pgrep -f '[t]orch.distributed.run.*clustercheck-remote[.]pyz stages'", check=False))

    verdict = _frozen_at_the_moment(cluster, tmp_path, row, torchrun_runs)
    ddp = checks(verdict)[("ddp_equivalence", None)]
    assert ddp["data"]["stalled_nodes"] == ["node2"], ddp["message"]
    assert ddp["data"]["progress"]["node2"]["step"] is None, ddp["message"]
    return verdict


@injects("node-frozen-stage")
def node_frozen_stage(cluster, tmp_path, row):
    """node2 frozen as the collectives stage starts: the moment clustercheck writes the job's command for node2 into
    the run directory, just before it sends it. Whether the command reached node2 first or not, node2 is named as
    a node that does not answer."""
    command_file = tmp_path / "run" / "hosts" / "node2" / "torch.command"
    verdict = _frozen_at_the_moment(cluster, tmp_path, row, command_file.exists)
    found = checks(verdict)
    for name in ("allreduce", "allgather", "broadcast"):
        assert found[(name, None)]["data"]["first_failed_node"] == "node2", found[(name, None)]["message"]
    return verdict


DRIFTED = "mpmath"  # a dependency of torch, installed on every node of the torch environment


@injects("package-version")
def package_version(cluster, tmp_path, row):
    node2 = cluster.node("node2")
    locate = f"from importlib import metadata; d = metadata.distribution('{DRIFTED}'); print(d._path, d.version)"
    path, version = on_node(node2, f'{cluster.python} -c "{locate}"').split()
    metadata = f"{path}/METADATA"
    on_node(node2, f"cp -p {metadata} {metadata}.orig && sed -i 's/^Version: .*/Version: 0.0.1/' {metadata}")
    try:
        verdict = run(cluster, tmp_path, row)
    finally:
        on_node(node2, f"mv {metadata}.orig {metadata}")
    drift = checks(verdict)[("consistency.packages", None)]
    assert f"{DRIFTED}: node2 has 0.0.1, the others {version}" in drift["message"]
    assert (tmp_path / "run" / "hosts" / "node2" / "packages.txt").read_text().count(f"{DRIFTED}==0.0.1") == 1
    assert f"{DRIFTED}=={version}" in (tmp_path / "run" / "hosts" / "node1" / "packages.txt").read_text()
    return verdict


@injects("ctrl-c")
def ctrl_c(cluster, tmp_path, row):
    with long_ddp_job(cluster, tmp_path, 29681, 150) as (proc, _):
        proc.send_signal(signal.SIGINT)
        sent = time.monotonic()
        stdout, stderr = proc.communicate(timeout=90)
        return Verdict(proc.returncode, stdout, stderr, time.monotonic() - sent)


@injects("gpus-missing")
def gpus_missing(cluster, tmp_path, row):
    inventory = tmp_path / "inventory.ini"
    inventory.write_text(Path(cluster.inventory).read_text().replace("[all:vars]\n", "[all:vars]\ngpus_per_node=1\n"))
    command = clustercheck_command(cluster, tmp_path, *row.args, "--format", "json")
    command[command.index(cluster.inventory)] = str(inventory)
    verdict = run(cluster, tmp_path, row, command=command)
    found = checks(verdict)
    for node in cluster.nodes:  # every node is named, each with the fix
        count = found[("gpu.count", node.name)]
        assert count["status"] == "FAIL" and "1 GPU(s) expected" in count["message"], count
        assert count["remediation"]
        assert found[("torch.import", node.name)]["status"] == "PASS"  # the rest of each node's results are kept
    return verdict


# ------------------------------------------------------------------------------------------- sshd as sites have it


def restart_sshd(cluster, node) -> None:
    on_node(node, "systemctl reset-failed ssh; systemctl restart ssh")
    wait_for_ssh(cluster, node)


def nothing_failed(verdict: Verdict) -> None:
    """A fault clustercheck works around: every check of the run passes (or warns, or is skipped), on every node."""
    failed = [
        f"{c['name']} {c['host']}: {c['message'][:200]}" for c in verdict.report["checks"] if c["status"] in FAILED
    ]
    assert not failed, failed


MAX_SESSIONS = "/etc/ssh/sshd_config.d/00-clustercheck-faults.conf"  # read first: its value wins


@injects("ssh-max-sessions")
def ssh_max_sessions(cluster, tmp_path, row):
    """node2's sshd allows one session per connection: the core stage's steps run at once, the DDP job's torchrun,
    progress polls and rank records too, each over a connection of its own; the run passes."""
    node2 = cluster.node("node2")
    on_node(node2, f"echo 'MaxSessions 1' > {MAX_SESSIONS}")
    try:
        assert "maxsessions 1" in on_node(node2, "sshd -T | grep -i '^maxsessions'")
        restart_sshd(cluster, node2)
        verdict = run(cluster, tmp_path, row, "--master-port", "29711")
    finally:
        on_node(node2, f"rm -f {MAX_SESSIONS}")
        restart_sshd(cluster, node2)
    nothing_failed(verdict)
    found = checks(verdict)
    assert found[("facts", "node2")]["status"] == "PASS"
    assert found[("ddp_equivalence", None)]["status"] == "PASS", found[("ddp_equivalence", None)]["message"]
    assert found[("ssh.session", "node2")]["data"]["connections"] > 1
    assert not found[("ssh.session", "node1")]["data"]["sessions_limited"]
    return verdict


GREETING = "Welcome to node2, managed by the HPC team"


@injects("login-shell-output")
def login_shell_output(cluster, tmp_path, row):
    """root's ~/.bashrc on node2 prints a greeting, which bash reads for every command sshd runs (and for the SFTP
    subsystem, which then fails): the run reads past it and names the file."""
    node2 = cluster.node("node2")
    on_node(node2, f"cp -p /root/.bashrc /root/.bashrc.faults && echo 'echo {GREETING}' >> /root/.bashrc")
    try:
        with ssh_client(cluster, node2) as client:  # what breaks for every tool that needs a silent shell
            assert ssh_run(client, "true", timeout=30)[1].startswith(GREETING)
            with pytest.raises(Exception, match="Garbage packet"):
                client.open_sftp()
        verdict = run(cluster, tmp_path, row)
    finally:
        on_node(node2, "mv /root/.bashrc.faults /root/.bashrc")
    nothing_failed(verdict)
    found = checks(verdict)
    assert found[("facts", "node2")]["status"] == "PASS" and found[("torch.import", "node2")]["status"] == "PASS"
    assert found[("python.env", "node2")]["message"] == found[("python.env", "node1")]["message"].replace(
        "node1", "node2"
    )  # the recorded python was read right, not with the greeting before it
    assert "~/.bashrc" in found[("ssh.session", "node2")]["remediation"]
    return verdict


@injects("same-machine-twice")
def same_machine_twice(cluster, tmp_path, row):
    node1 = cluster.node("node1")
    inventory = tmp_path / "inventory.ini"
    lines = Path(cluster.inventory).read_text().splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if line.startswith("node1 "))
    lines.insert(at + 1, f"node1-again ansible_host={node1.address}\n")  # the copy-paste slip: below the original
    inventory.write_text("".join(lines))
    command = clustercheck_command(cluster, tmp_path, *row.args, "--format", "json")
    command[command.index(cluster.inventory)] = str(inventory)
    verdict = run(cluster, tmp_path, row, command=command)
    found = checks(verdict)
    distinct = found[("nodes.distinct", None)]
    checked = distinct["data"]["same_machine"]
    assert sorted([*checked, *checked.values()]) == ["node1", "node1-again"], checked
    twin = next(iter(checked))
    assert ("facts", twin) not in found  # nothing ran twice on node1
    tcp = found[("network.tcp", None)]
    assert tcp["status"] == "SKIP" and "the same machine as" in tcp["message"], tcp
    return verdict


@injects("link-slowed-baseline")
def link_slowed_baseline(cluster, tmp_path, row):
    """The cluster's own earlier figures catch what no threshold does: a healthy run's report, then node2's link
    shaped to 50 Mbit/s (a link renegotiated at a lower speed), then the same run against that report."""
    (tmp_path / "healthy").mkdir()
    healthy = subprocess.run(
        clustercheck_command(cluster, tmp_path / "healthy", *row.args, "--format", "json"),
        capture_output=True,
        text=True,
        timeout=row.deadline + 120,
    )
    assert healthy.returncode == 0, healthy.stderr[-3000:]
    baseline = tmp_path / "baseline.json"
    baseline.write_text(healthy.stdout)
    node2 = cluster.node("node2")
    on_node(node2, "tc qdisc add dev eth0 root tbf rate 50mbit burst 64kb latency 50ms")
    try:
        verdict = run(cluster, tmp_path, row, "--baseline", str(baseline))
    finally:
        on_node(node2, "tc qdisc del dev eth0 root")
    throughput = checks(verdict)[("baseline.throughput", None)]
    slowed = {c["key"] for c in throughput["data"]["changes"] if c["status"] == "FAIL"}
    assert slowed >= {"node2 -> node1", "node2 -> node3"}, throughput
    return verdict


# ------------------------------------------------------------------------ the way the inventory reaches a node


def behind_bastion(cluster, tmp_path: Path, row: Fault, ssh_args: dict[str, str], by_name: bool = True) -> Verdict:
    """ROW's run with the inventory's lines for the nodes in SSH_ARGS given those ssh arguments (beside the
    known_hosts file the cluster's inventory names for every node) and, BY_NAME, named by their names alone: only
    the cluster's own network resolves them, so nothing reaches them but through another node."""
    known = f"-o UserKnownHostsFile={cluster.known_hosts} -o StrictHostKeyChecking=yes"
    lines = []
    for line in Path(cluster.inventory).read_text().splitlines(keepends=True):
        name = line.split(" ", 1)[0]
        if name in ssh_args and "ansible_host=" in line:
            kept = line.rstrip("\n") if not by_name else name
            line = f"{kept} ansible_ssh_common_args='{known} {ssh_args[name]}'\n"
        lines.append(line)
    inventory = tmp_path / "inventory.ini"
    inventory.write_text("".join(lines))
    command = clustercheck_command(cluster, tmp_path, *row.args, "--format", "json")
    command[command.index(cluster.inventory)] = str(inventory)
    return run(cluster, tmp_path, row, command=command)


@injects("bastion-proxycommand")
def bastion_proxycommand(cluster, tmp_path, row):
    bastion = cluster.node("node1").address
    proxy = (
        f'-o ProxyCommand="ssh -W %h:%p -q -i {cluster.key_file} -o UserKnownHostsFile={cluster.known_hosts} '
        f'root@{bastion}"'
    )
    verdict = behind_bastion(cluster, tmp_path, row, {"node2": proxy, "node3": proxy})
    connect = checks(verdict)[("connect", "node3")]
    assert "through ProxyCommand 'ssh -W node3:22" in connect["message"], connect
    return verdict


@injects("bastion-two-hops")
def bastion_two_hops(cluster, tmp_path, row):
    config = tmp_path / "jump_config"  # what OpenSSH's jump hosts read (ssh passes them -F, not the -o options)
    config.write_text(
        f"Host *\n    User root\n    IdentityFile {cluster.key_file}\n    UserKnownHostsFile {cluster.known_hosts}\n"
    )
    hops = f"root@{cluster.node('node1').address},node2"
    return behind_bastion(cluster, tmp_path, row, {"node3": f"-F {config} -J {hops}"})


@injects("ssh-option-unhonourable")
def ssh_option_unhonourable(cluster, tmp_path, row):
    token = "-I /usr/lib/x86_64-linux-gnu/opensc-pkcs11.so"  # ssh's flag for PKCS11Provider
    verdict = behind_bastion(cluster, tmp_path, row, {"node2": token}, by_name=False)
    assert verdict.report is None and "Traceback" not in verdict.stderr  # refused before any node was contacted
    return verdict


@injects("slurm-node-drained")
def _slurm_node_drained(cluster, tmp_path, row):
    return _slurm_keeps_out(cluster, tmp_path, row, "node2", "drain", "PSU swap, ticket 7")


@injects("slurm-node-down")
def _slurm_node_down(cluster, tmp_path, row):
    return _slurm_keeps_out(cluster, tmp_path, row, "node3", "down", "fan failure")


def _slurm_keeps_out(cluster, tmp_path, row, name: str, state: str, reason: str) -> Verdict:
    """NAME put in STATE by an administrator (scontrol on node1, Slurm's controller), then `clustercheck run ROW.args`
    run on node1 as on a login node (the clustercheck the slurm role installed); NAME resumed, and every node idle in
    Slurm again, before the next row."""
    controller = cluster.node("node1")
    on_node(controller, f"scontrol update nodename={name} state={state} reason={shlex.quote(reason)}")
    try:
        line = f"cd /root && clustercheck run {shlex.join(row.args)}"
        return run(cluster, tmp_path, row, command=["docker", "exec", controller.container, "sh", "-c", line])
    finally:
        on_node(controller, f"scontrol update nodename={name} state=resume", check=False)
        deadline = time.monotonic() + 60
        shown = f"sinfo --noheader --Node --nodes={name} --format=%T | sort -u"  # a line per partition
        while on_node(controller, shown, check=False).strip() != "idle":
            assert time.monotonic() < deadline, f"{name} not idle in Slurm again"
            time.sleep(2)


# ------------------------------------------------------------------- a managed file drifted on one node (issue 50, 5)


def _drift_file(node, path: str, old: str, new: str) -> None:
    """PATH on NODE with its line OLD made NEW, edited in place as an operator's editor would; the file kept beside it
    (PATH.faults) for _put_file_back."""
    on_node(node, f"cp -p {path} {path}.faults")
    text = on_node(node, f"cat {path}")
    assert f"\n{old}\n" in f"\n{text}", f"{node.name}: no line {old!r} in {path}"
    on_node(node, f"cat > {path}", input=f"\n{text}".replace(f"\n{old}\n", f"\n{new}\n", 1)[1:])


def _put_file_back(node, path: str) -> None:
    on_node(node, f"cat {path}.faults > {path} && rm {path}.faults")


@injects("slurm-conf-edited")
def slurm_conf_edited(cluster, tmp_path, row):
    """node3's slurm.conf with one setting changed by hand (ReturnToService, which slurmctld alone reads: no job or
    node changes behaviour meanwhile) and slurmd restarted there, so that it runs with it; slurmctld then logs that
    node3's slurm.conf differs from its own."""
    node3 = cluster.node("node3")
    conf = on_node(node3, "cat /etc/slurm/slurm.conf")
    value = re.search(r"^ReturnToService=(\d)$", conf, re.M).group(1)
    _drift_file(
        node3, "/etc/slurm/slurm.conf", f"ReturnToService={value}", f"ReturnToService={1 if value != '1' else 2}"
    )
    try:
        on_node(node3, "systemctl restart slurmd")
        verdict = run(cluster, tmp_path, row)
    finally:
        _put_file_back(node3, "/etc/slurm/slurm.conf")
        on_node(node3, "systemctl restart slurmd")
    files = checks(verdict)[("consistency.files", None)]
    assert [d["path"] for d in files["data"]["differ"]] == ["/etc/slurm/slurm.conf"]  # nothing else differs
    assert files["fix_command"] == shlex.join(  # the slurm role, on node3 alone
        ["ansible-playbook", "site.yml", "-i", cluster.inventory, "--limit", "node3", "--tags", "slurm"]
    )
    return verdict


@injects("chrony-conf-drifted")
def chrony_conf_drifted(cluster, tmp_path, row):
    """node2's chrony.conf with `makestep 1 3` made `makestep 1 -1` by hand (not yet applied: chronyd reads it at its
    next start). node1's chrony.conf differs from its clients' by design (it serves time: allow, local stratum)."""
    node2 = cluster.node("node2")
    _drift_file(node2, "/etc/chrony/chrony.conf", "makestep 1 3", "makestep 1 -1")
    try:
        verdict = run(cluster, tmp_path, row)
    finally:
        _put_file_back(node2, "/etc/chrony/chrony.conf")
    files = checks(verdict)[("consistency.files", None)]
    assert [d["path"] for d in files["data"]["differ"]] == ["/etc/chrony/chrony.conf"]
    assert files["fix_command"] == shlex.join(
        ["ansible-playbook", "site.yml", "-i", cluster.inventory, "--limit", "node2", "--tags", "base"]
    )
    return verdict


# Issue 50, section 1: a file system a job needs is full. Each fills a real file system on the node to its last
# block (dd until ENOSPC) and puts it back whole.
FILL = "dd if=/dev/zero of={path} bs=1M 2>/dev/null; test ! -s {path} && exit 1; sync; true"


@injects("tmp-full")
def tmp_full(cluster, tmp_path, row):
    """node2's /tmp a 16 MiB tmpfs, full: the collector cannot be written there, and the facts' error says why."""
    node2 = cluster.node("node2")
    in_mount_namespace(node2, "mount", "-t", "tmpfs", "-o", "size=16m,mode=1777", "tmpfs", "/tmp")
    try:
        in_mount_namespace(node2, "sh", "-c", FILL.format(path="/tmp/fill"))
        verdict = run(cluster, tmp_path, row)
    finally:
        in_mount_namespace(node2, "umount", "/tmp")
    assert checks(verdict)[("facts", "node2")]["remediation"].startswith("free it"), checks(verdict)[("facts", "node2")]
    return verdict


@injects("shm-dead-segments")
def shm_dead_segments(cluster, tmp_path, row):
    """node3's /dev/shm filled by a job that wrote its segments and died: named with the free space and the files no
    live process owns."""
    node3 = cluster.node("node3")
    in_mount_namespace(node3, "mount", "-o", "remount,size=300m", "/dev/shm")
    try:
        # A crashed job's ranks: each wrote its segment (75 MiB, the last until ENOSPC) and exited.
        segments = "for i in 0 1 2 3 4; do dd if=/dev/zero of=/dev/shm/nccl-Dead0$i bs=1M count=75; done 2>/dev/null"
        on_node(node3, segments + "; true")
        verdict = run(cluster, tmp_path, row)
    finally:
        on_node(node3, "rm -f /dev/shm/nccl-Dead0*", check=False)
        in_mount_namespace(node3, "mount", "-o", "remount,size=1g", "/dev/shm")
    dead = checks(verdict)[("shm.segments", "node3")]
    assert dead["status"] == "WARN" and len(dead["data"]["dead"]) >= 4, dead
    return verdict


@injects("home-full")
def home_full(cluster, tmp_path, row):
    """node2's home directory (root's: the user clustercheck runs as) a 16 MiB tmpfs, full; SSH still lets in (the
    key and dotfiles copied in first)."""
    node2 = cluster.node("node2")
    keep = "mkdir -p /run/home-full && cp -a /root/.ssh /root/.bashrc /root/.profile /run/home-full/"
    on_node(node2, keep)
    in_mount_namespace(node2, "mount", "-t", "tmpfs", "-o", "size=16m,mode=0700", "tmpfs", "/root")
    try:
        on_node(node2, "cp -a /run/home-full/. /root/")
        in_mount_namespace(node2, "sh", "-c", FILL.format(path="/root/fill"))
        verdict = run(cluster, tmp_path, row)
    finally:
        in_mount_namespace(node2, "umount", "/root")
        on_node(node2, "rm -rf /run/home-full", check=False)
    return verdict


# A firewall drops or rejects part of the ports training uses (issue 50, 2): one rule, first in INPUT like a site's
# own in front of ufw's, in the `firewall` row's chain; the run's own options pick the stage.
EPHEMERAL_RULES = {
    "ephemeral-drop": ("node3", "--dport 32768:45000 -m conntrack --ctstate NEW -j DROP"),
    # NEW only, as the row says: without it the rule also resets the answers to node2's own connections whose source
    # port falls in the range, and node2's probes out fail now and then (a real fault, but another one)
    "ephemeral-reject": ("node2", "--dport 38000:48000 -m conntrack --ctstate NEW -j REJECT --reject-with tcp-reset"),
    # gloo's lower address listens, the higher connects (gloo/transport/tcp/pair.cc, Pair::connect): node1's ranks
    # listen for node2's and node3's, on ports the kernel draws from its ip_local_port_range
    "ephemeral-stall": ("node1", "--dport 32768:60999 -m conntrack --ctstate NEW -j DROP"),
}


def _with_rule(cluster, tmp_path, row) -> tuple[Verdict, dict]:
    """ROW's rule on its node during the run; the verdict and the run's checks."""
    name, match = EPHEMERAL_RULES[row.id]
    node = cluster.node(name)
    # every address of the others, their rails' too: a rank connects from its own rail
    sources = ",".join(a for n in cluster.nodes if n.name != name for a in cluster.addresses(n.name))
    on_node(
        node,
        "command -v iptables >/dev/null || (apt-get update -qq && "
        "DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends iptables >/dev/null)",
    )
    on_node(
        node, f"iptables -N {CHAIN} && iptables -I INPUT -j {CHAIN} && iptables -A {CHAIN} -s {sources} -p tcp {match}"
    )
    try:
        verdict = run(cluster, tmp_path, row)
    finally:
        on_node(node, f"iptables -D INPUT -j {CHAIN}; iptables -F {CHAIN}; iptables -X {CHAIN}", check=False)
    assert CHAIN not in on_node(node, "iptables -S")  # restored
    return verdict, checks(verdict)


def _sampled(cluster, tmp_path, row) -> Verdict:
    verdict, found = _with_rule(cluster, tmp_path, row)
    name = EPHEMERAL_RULES[row.id][0]
    sampled = found[("network.ports", name)]
    assert sampled["data"]["blocked"] and sampled["data"]["connected"], sampled  # a part of the range, not all of it
    assert sampled["data"]["from"] == sorted(n.name for n in cluster.nodes if n.name != name)
    assert f"-A {CHAIN} " in sampled["message"]  # the node's own rule, quoted
    assert found[("network.tcp", None)]["status"] == "PASS"  # the probe's own ports are open: the sample finds it
    return verdict


@injects("ephemeral-drop")
def ephemeral_drop(cluster, tmp_path, row):
    return _sampled(cluster, tmp_path, row)


@injects("ephemeral-reject")
def ephemeral_reject(cluster, tmp_path, row):
    return _sampled(cluster, tmp_path, row)


@injects("ephemeral-stall")
def ephemeral_stall(cluster, tmp_path, row):
    """The network stage skipped: the DDP job hangs, and its ranks' connections name node1."""
    verdict, found = _with_rule(cluster, tmp_path, row)
    ddp = found[("ddp_equivalence", None)]
    assert ddp["data"]["stalled_nodes"] == ["node1"], ddp["message"]
    (wait, *_) = ddp["data"]["connections"]["waits"]
    assert wait["to"] == "node1" and wait["from"] == ["node2", "node3"] and wait["listening"], wait
    assert f"-A {CHAIN} " in ddp["message"] and ddp["remediation"].startswith("On node1")
    return verdict


# ------------------------------------------------------------------------------------ the fabric, pair by pair

THROTTLE = "tbf rate 100mbit burst 32kbit latency 400ms"  # a rail at a tenth of a 1 Gb/s link's speed


def throttled(cluster, tmp_path: Path, row: Fault, node: str, interfaces: tuple[str, ...]) -> Verdict:
    """ROW's run with NODE's INTERFACES (rails) shaped on their way out; no path and no other node is blamed."""
    target = cluster.node(node)
    for iface in interfaces:
        on_node(target, f"tc qdisc add dev {iface} root {THROTTLE}")
    try:
        verdict = run(cluster, tmp_path, row)
    finally:
        for iface in interfaces:
            on_node(target, f"tc qdisc del dev {iface} root", check=False)
    if verdict.report:
        paths = checks(verdict)[("fabric.paths", None)]
        assert paths["status"] == "PASS", f"a path blamed besides {node}'s rails: {paths['message']}"
        figures = [c for c in verdict.report["checks"] if c["name"] == "fabric.pairs"]
        assert len(figures) == 3 and all(len(c["data"]["rails"]) == 2 for c in figures), "a figure per (node, rail)"
    return verdict


@injects("rail-throttled")
def rail_throttled(cluster, tmp_path, row):
    return throttled(cluster, tmp_path, row, "node2", ("eth2",))


@injects("node-rails-throttled")
def node_rails_throttled(cluster, tmp_path, row):
    return throttled(cluster, tmp_path, row, "node3", ("eth1", "eth2"))
