"""`clustercheck run` against the 3-node test cluster, over SSH, as a user runs it; each test on the nodes it asks
for: with torch in their environment (torch_cluster) or bare (bare_cluster).

Destructive tests (a torchvision that does not import) restore their cluster at the end; the faults clustercheck
must name (a node down, a changed host key, Ctrl-C, ...) are tests/faults/'s rows.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import testcluster
from harness import (
    CLUSTERCHECK,
    PYTHON,
    SWEEP,
    checks_of,
    clustercheck,
    clustercheck_command,
    leftovers,
    on,
    pause,
    ssh_client,
    ssh_run,
)

from clustercheck.checks import registry

pytestmark = pytest.mark.cluster


def test_every_check_runs_over_ssh_on_every_node(torch_cluster, tmp_path):
    proc = clustercheck(torch_cluster, tmp_path, "--format", "json", "--master-port", "29621")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    checks = checks_of(proc)
    report = json.loads(proc.stdout)
    assert report["schema_version"] == 1 and report["hosts"] == ["node1", "node2", "node3"]
    for node in torch_cluster.nodes:
        name = node.name
        assert checks[("connect", name)]["status"] == "PASS"
        assert f"SSH to {node.address}" in checks[("connect", name)]["message"]
        torch = checks[("torch.import", name)]
        assert torch["status"] == "PASS", torch
        assert torch["data"]["python"] == PYTHON and torch["data"]["torch"] == "2.13.0+cpu"
        assert checks[("python.env", name)]["data"]["source"] == "/etc/clustercheck/python"
        assert checks[("hostname.resolve", name)]["status"] == "PASS"
        assert checks[("shm.size", name)]["status"] == "PASS"
        for collective in ("local.allreduce", "local.allgather", "local.broadcast"):
            assert checks[(collective, name)]["status"] == "PASS"
            assert checks[(collective, name)]["data"]["wrong"] == 0
        assert checks[("gpu.count", name)]["status"] == "SKIP"  # no GPU here, and none expected
        assert {c["status"] for (_, host), c in checks.items() if host == name} <= {"PASS", "WARN", "SKIP"}
        assert json.loads((tmp_path / "run" / "hosts" / name / "facts.json").read_text())["torch"]["version"]
        local = tmp_path / "run" / "hosts" / name / "torch" / "local"  # a part of the run's one torch job
        first = 2 * [n.name for n in torch_cluster.nodes].index(name)  # the node's ranks in the job: 2 per node
        assert sorted(p.name for p in local.glob("rank-*.json")) == [f"rank-{first}.json", f"rank-{first + 1}.json"]
    for field in ("torch", "python", "gpu_count", "mtu", "clock"):
        assert checks[(f"consistency.{field}", None)]["status"] == "PASS", checks[(f"consistency.{field}", None)]
    # Then the multi-node stages, over every node at once: network, collectives, DDP equivalence.
    tcp = checks[("network.tcp", None)]
    assert tcp["status"] == "PASS" and tcp["data"]["pairs"] == 6, tcp
    assert checks[("network.master_port", "node1")]["status"] == "PASS"
    assert checks[("network.mtu", None)]["status"] == "PASS"
    for collective in ("allreduce", "allgather", "broadcast"):
        result = checks[(collective, None)]
        assert result["status"] == "PASS" and result["data"]["world_size"] == 6 and result["data"]["wrong"] == 0
    assert checks[("allreduce.bandwidth", None)]["data"]["ranks"] == 6
    ddp = checks[("ddp_equivalence", None)]
    assert ddp["status"] == "PASS", ddp["message"]
    assert ddp["data"]["world_size"] == 6 and ddp["data"]["backend"] == "gloo"
    assert ddp["data"]["max_abs_param_diff"] < 1e-12
    checkpoint = checks[("checkpoint", None)]  # saved by rank 0, loaded by every rank: the same state
    assert checkpoint["status"] == "PASS" and "bit for bit" in checkpoint["message"], checkpoint["message"]
    assert checkpoint["data"]["bytes"] > 0 and checkpoint["data"]["via"] == "sent from rank 0"
    # Lightning is not installed (test_training.py installs it for its own tests): its stage is SKIP, naming the
    # nodes, not a failure.
    assert checks[("lightning.ddp", None)]["status"] == "SKIP"
    assert "Lightning does not import on node1, node2, node3" in checks[("lightning.ddp", None)]["message"]
    assert checks[("lightning.import", "node2")]["status"] == "SKIP"
    command = (tmp_path / "run" / "hosts" / "node2" / "torch.command").read_text()
    assert "GLOO_SOCKET_IFNAME=eth0" in command and "--node-rank=1" in command
    assert f"--master-addr={torch_cluster.node('node1').address}" in command
    for name in ("node1", "node2", "node3"):  # every node's rank records and logs came back
        assert len(list((tmp_path / "run" / "hosts" / name / "torch" / "ddp").glob("rank-*.json"))) == 2
    assert {c["name"] for c in report["checks"]} <= set(registry.REGISTRY)  # every name is in the catalog
    junit = ET.parse(tmp_path / "run" / "report.xml").getroot()
    assert [s.get("name") for s in junit.iter("testsuite")] == ["node1", "node2", "node3", "(cluster)"]
    assert not leftovers(torch_cluster)


def test_an_unknown_host_key_is_refused(bare_cluster, tmp_path):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    proc = clustercheck(bare_cluster, tmp_path, "--limit", "node1", "--known-hosts", str(empty), "--format", "json")
    assert proc.returncode == 4, proc.stderr
    assert "Traceback" not in proc.stderr
    connect = checks_of(proc)[("connect", "node1")]
    assert connect["status"] == "FAIL" and connect["data"]["host_key"]
    assert "unknown host key" in connect["message"] and "SHA256:" in connect["message"]
    assert "--accept-new-host-keys" in connect["message"]
    assert ("facts", "node1") not in checks_of(proc)  # nothing ran on a host we could not authenticate
    assert empty.read_text() == ""


def test_accept_new_records_unknown_keys(bare_cluster, tmp_path):
    new = tmp_path / "known_hosts"
    new.write_text("")
    args = ["--limit", "node1", "--only", "core", "--skip", "local.*", "--known-hosts", str(new), "--format", "json"]
    first = clustercheck(bare_cluster, tmp_path, *args, "--accept-new-host-keys")
    assert first.returncode != 4, first.stderr
    assert checks_of(first)[("connect", "node1")]["status"] == "PASS"
    recorded = new.read_text()
    assert recorded.startswith(bare_cluster.node("node1").address + " ")
    assert checks_of(clustercheck(bare_cluster, tmp_path, *args))[("connect", "node1")]["status"] == "PASS"


def test_hashed_known_hosts_entries_are_understood(bare_cluster, tmp_path):
    hashed = tmp_path / "known_hosts"
    hashed.write_text(Path(bare_cluster.known_hosts).read_text())
    subprocess.run(["ssh-keygen", "-H", "-f", str(hashed)], check=True, capture_output=True)
    assert "|1|" in hashed.read_text() and "node1" not in hashed.read_text()
    proc = clustercheck(
        bare_cluster, tmp_path, "--only", "core", "--skip", "local.*", "--known-hosts", str(hashed), "--format", "json"
    )
    assert proc.returncode != 4, proc.stderr
    assert all(checks_of(proc)[("connect", n.name)]["status"] == "PASS" for n in bare_cluster.nodes)


def test_a_skipped_network_measurement_is_not_made_on_the_nodes(bare_cluster, tmp_path):
    """--skip network.rtt: the probes on the nodes make no round trip (their records have none), and network.rtt
    is SKIP in the usual shape while network.throughput is judged."""
    args = ["--only", "network", "--skip", "network.rtt", "--format", "json", "--master-port", "29631"]
    proc = clustercheck(bare_cluster, tmp_path, *args)
    assert "Traceback" not in proc.stderr
    checks = checks_of(proc)
    rtt = checks[("network.rtt", None)]
    assert rtt["status"] == "SKIP" and rtt["message"] == "network.rtt skipped: not selected (--skip network.rtt)"
    assert checks[("network.throughput", None)]["status"] in ("PASS", "WARN"), checks[("network.throughput", None)]
    made = []
    for node in bare_cluster.nodes:
        record = json.loads((tmp_path / "run" / "hosts" / node.name / "network.json").read_text().splitlines()[-1])
        made += [e for e in record["perf"] if not e.get("served") and "error" not in e]
    assert made and all("out_mbps" in e and "rtt_ms" not in e for e in made), made


def test_a_timed_out_torch_job_is_killed_on_every_node(torch_cluster, tmp_path):
    proc = clustercheck(torch_cluster, tmp_path, "--timeout", "1", "--format", "json", "--master-port", "29641")
    assert proc.returncode == 1
    checks = checks_of(proc)
    for node in torch_cluster.nodes:
        allreduce = checks[("local.allreduce", node.name)]
        assert allreduce["status"] == "FAIL" and "timed out" in allreduce["message"], allreduce
    assert leftovers(torch_cluster) == {}


def test_a_node_frozen_during_its_node_local_job_is_named_as_not_answering(torch_cluster, tmp_path):
    """node2 paused (docker pause: sshd and all, as a machine that stops answering) as soon as the ranks of its
    node-local collectives job beat, while they import torch. The job is node2's alone: the core stage names node2
    as not answering within the stall timeout, not a hang of every node; node1 and node3 pass."""
    node2 = torch_cluster.node("node2")
    stall = 30
    command = clustercheck_command(
        torch_cluster, tmp_path, "--only", "core", "--stall-timeout", str(stall), "--format", "json"
    )
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    with open(out, "w") as stdout, open(err, "w") as stderr:
        proc = subprocess.Popen(command, stdout=stdout, stderr=stderr, text=True)
    # Watched from inside the node, 10 ms apart: the ranks' first heartbeat; then the pause at once.
    beats = "ls /tmp/clustercheck-*/local-collectives/heartbeat/rank-*.json >/dev/null 2>&1"
    watch = subprocess.Popen(["docker", "exec", node2.container, "sh", "-c", f"until {beats}; do sleep 0.01; done"])
    try:
        while watch.poll() is None and proc.poll() is None:
            time.sleep(0.01)
        assert watch.poll() == 0, f"clustercheck ended before node2's ranks beat:\n{err.read_text()[-3000:]}"
        pause(node2.container)
        frozen_at = time.monotonic()
        try:
            proc.wait(timeout=300)
            seconds = time.monotonic() - frozen_at
        finally:
            subprocess.run(["docker", "unpause", node2.container], capture_output=True)
    finally:
        for running in (proc, watch):
            if running.poll() is None:
                running.kill()
                running.wait()
        on(node2, SWEEP, check=False)  # what the run could not clean up on the frozen node
    assert proc.returncode == 1, err.read_text()[-3000:]
    checks = {(c["name"], c["host"]): c for c in json.loads(out.read_text())["checks"]}
    frozen = checks[("local.allreduce", "node2")]
    assert frozen["status"] == "FAIL", frozen
    assert re.search(r"node node2 stopped making progress .*; its SSH connection does not answer", frozen["message"])
    assert "no single node explains" not in frozen["message"] and "timed out" not in frozen["message"]
    assert frozen["data"]["stalled_nodes"] == ["node2"], frozen["message"]
    for name in ("node1", "node3"):
        assert checks[("local.allreduce", name)]["status"] == "PASS", checks[("local.allreduce", name)]
    assert seconds < stall + 90, f"the verdict came {seconds:.0f} s after node2 froze:\n{err.read_text()[-2000:]}"


def test_ssh_config_with_proxyjump_reaches_a_node_through_another(bare_cluster, tmp_path):
    """~/.ssh/config's HostName, User, IdentityFile, UserKnownHostsFile and ProxyJump (node2 through node1)."""
    node1, node2 = bare_cluster.node("node1"), bare_cluster.node("node2")
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host behind-node1\n    HostName {node2.address}\n    ProxyJump {node1.address}\n\n"
        f"Host *\n    User root\n    IdentityFile {bare_cluster.key_file}\n"
        f"    UserKnownHostsFile {bare_cluster.known_hosts}\n"
    )
    proc = subprocess.run(
        [
            CLUSTERCHECK,
            "run",
            "--hosts",
            "behind-node1",
            "--ssh-config",
            str(config),
            "--skip",
            "local.*",
            "--only",
            "core",
            "--format",
            "json",
            "--run-dir",
            str(tmp_path / "run"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    checks = checks_of(proc)
    assert checks[("connect", "behind-node1")]["status"] == "PASS", proc.stderr[-2000:]
    assert checks[("hostname.resolve", "behind-node1")]["data"]["hostname"] == "node2"


# Ansible's FAQ, "How do I configure a jump host to access servers that I have no direct access to?"
# (docs.ansible.com, reference_appendices/faq.html): `ansible_ssh_common_args: '-o ProxyCommand="ssh -W %h:%p -q
# user@gateway.example.com"'`. Here the gateway is node1 (by address), and node2 and node3 are named by their names,
# which only the cluster's own network resolves: the controller cannot reach them but through node1.
FAQ_PROXYCOMMAND = '-o ProxyCommand="ssh -W %h:%p -q -i {key} -o UserKnownHostsFile={known} root@{bastion}"'


@pytest.mark.parametrize("form", ["proxycommand", "proxyjump-two-hops"])
def test_an_inventory_of_nodes_behind_a_bastion_works_for_ansible_and_for_clustercheck(bare_cluster, tmp_path, form):
    """Ansible's FAQ form of a bastion (ProxyCommand) and the -J form with two hops (each hop's user, key and known
    hosts from the -F file the arguments name, as OpenSSH passes -F to its jump hosts): `ansible -m ping` works
    with the inventory, and so does `clustercheck run --only core`, reaching each node the same way."""
    node1 = bare_cluster.node("node1")
    with pytest.raises(OSError):
        socket.getaddrinfo("node2", 22)  # not resolvable here: only a way through node1 reaches the nodes
    key, known = bare_cluster.key_file, bare_cluster.known_hosts
    if form == "proxycommand":
        proxy = FAQ_PROXYCOMMAND.format(key=key, known=known, bastion=node1.address)
        args = {
            name: f"-o UserKnownHostsFile={known} -o StrictHostKeyChecking=yes {proxy}" for name in ("node2", "node3")
        }
        way = {name: "through ProxyCommand 'ssh -W " + name for name in args}
    else:
        config = tmp_path / "jump_config"
        config.write_text(f"Host *\n    User root\n    IdentityFile {key}\n    UserKnownHostsFile {known}\n")
        hops = {"node2": f"root@{node1.address},node3", "node3": f"{node1.address},root@node2"}
        args = {name: f"-F {config} -J {jump}" for name, jump in hops.items()}
        way = {name: f"through ProxyJump {jump}" for name, jump in hops.items()}
    inventory = tmp_path / "gatewayed.yml"
    inventory.write_text(
        "all:\n  vars:\n    ansible_user: root\n    ansible_python_interpreter: /usr/bin/python3\n"
        f"    ansible_ssh_private_key_file: {key}\n  hosts:\n"
        + "".join(f"    {name}:\n      ansible_ssh_common_args: '{arg}'\n" for name, arg in args.items())
    )
    ansible = Path(sys.executable).parent / "ansible"
    pinged = subprocess.run(
        [str(ansible), "-i", str(inventory), "all", "-m", "ping"],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=tmp_path,
        env={**os.environ, "ANSIBLE_SSH_ARGS": "-o ControlMaster=no"},  # no ssh left running after the test
    )
    assert pinged.returncode == 0, pinged.stdout[-2000:] + pinged.stderr[-2000:]
    empty = tmp_path / "ssh_config"
    empty.touch()
    proc = subprocess.run(
        [
            CLUSTERCHECK,
            "run",
            "--hosts",
            str(inventory),
            "--ssh-config",
            str(empty),
            "--only",
            "core",
            "--skip",
            "local.*",
            "--format",
            "json",
            "--run-dir",
            str(tmp_path / "run"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    checks = checks_of(proc)
    for name in ("node2", "node3"):
        connect = checks[("connect", name)]
        assert connect["status"] == "PASS", proc.stderr[-2000:]
        assert way[name] in connect["message"], connect["message"]
        assert checks[("hostname.resolve", name)]["data"]["hostname"] == name
    assert leftovers(bare_cluster) == {}


@pytest.fixture(scope="module")
def pypi_torchvision() -> Path:
    """PyPI's torchvision wheel for the nodes' torch release: built against PyPI's CUDA torch, not the CPU build
    the nodes have, as a user who pip-installs torchvision beside a wheelhouse torch gets it."""
    target = testcluster.CACHE_DIR / "torchvision"
    wheels = sorted(target.glob("torchvision-0.28.0-*.whl"))
    if not wheels:
        pip = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d", str(target)]
        subprocess.run([*pip, "torchvision==0.28.0"], check=True)
        wheels = sorted(target.glob("torchvision-0.28.0-*.whl"))
    return wheels[0]


def test_a_torchvision_that_does_not_import_is_named_on_its_node(torch_cluster, tmp_path, pypi_torchvision):
    node2 = torch_cluster.node("node2")
    with ssh_client(torch_cluster, node2) as client:
        with client.open_sftp() as sftp:
            sftp.put(str(pypi_torchvision), f"/tmp/{pypi_torchvision.name}")
        status, out = ssh_run(client, f"{PYTHON} -m pip install -q --no-deps --no-index /tmp/{pypi_torchvision.name}")
        assert status == 0, out
        try:
            proc = clustercheck(torch_cluster, tmp_path, "--format", "json", "--only", "core", "--skip", "local.*")
        finally:
            ssh_run(client, f"{PYTHON} -m pip uninstall -q -y torchvision; rm -f /tmp/{pypi_torchvision.name}")
    assert proc.returncode == 1, proc.stderr[-2000:]
    checks = checks_of(proc)
    result = checks[("torch.import", "node2")]
    assert result["status"] == "FAIL"
    assert "torchvision 0.28.0 does not import" in result["message"]
    assert "operator torchvision::nms does not exist" in result["message"]
    assert result["remediation"]
    assert checks[("torch.import", "node1")]["status"] == "PASS"


def test_a_second_run_against_the_first_names_a_regression_with_then_and_now(torch_cluster, tmp_path):
    """`--baseline` of a real run: the network's figures (every pair's round trip and throughput), each node's
    collector time and the versions compared for real; the first report's throughput from node2 made a hundred
    times what was measured, so this run is about -99 % there and FAILs naming node2's pairs, however much faster
    the shared machine lets this run go than the first (a busy CI machine's throughput varied fivefold between two
    runs: ten times left node2 -> node1 at -50 %, a WARN). Only the network stage: the comparison of busbw and the
    DDP step is tested on a real run's report in tests/unit/test_baseline.py."""
    for run in ("first", "second"):
        (tmp_path / run).mkdir()
    first = clustercheck(
        torch_cluster, tmp_path / "first", "--format", "json", "--only", "network", "--master-port", "29623"
    )
    assert first.returncode == 0, first.stderr[-3000:]
    report = json.loads(first.stdout)
    flows = next(c for c in report["checks"] if c["name"] == "network.throughput")["data"]["flows"]
    assert len(flows) == 6  # every pair, each way
    for flow in flows:
        if flow["from"] == "node2":
            flow["mbps"] *= 100
    baseline = tmp_path / "baseline.json"
    baseline.write_text(json.dumps(report))
    second = clustercheck(
        torch_cluster, tmp_path / "second", "--format", "json", "--only", "network", "--master-port", "29623",
        "--baseline", str(baseline),
    )  # fmt: skip
    assert second.returncode == 1, second.stderr[-3000:]
    assert "Traceback" not in second.stderr
    checks = checks_of(second)
    throughput = checks[("baseline.throughput", None)]
    assert throughput["status"] == "FAIL", throughput
    named = {c["key"] for c in throughput["data"]["changes"] if c["status"] == "FAIL"}
    assert named >= {"node2 -> node1", "node2 -> node3"}, throughput  # and any pair the shared machine slowed
    assert re.search(
        r"node2 -> node[13] throughput [\d.]+ [MG]bit/s, baseline [\d.]+ [MG]bit/s \(-\d+ %\)", throughput["message"]
    )
    rtt = checks[("baseline.rtt", None)]
    assert {c["key"] for c in rtt["data"]["changes"]} == {"node1 <-> node2", "node1 <-> node3", "node2 <-> node3"}
    assert all(c["now"] > 0 and c["baseline"] > 0 for c in rtt["data"]["changes"])
    for name in ("node1", "node2", "node3"):
        (collector,) = checks[("baseline.collector", name)]["data"]["changes"]
        assert collector["key"] == name and collector["now"] > 0 and collector["baseline"] > 0
    versions = checks[("baseline.versions", None)]
    assert versions["status"] == "PASS" and "torch" in versions["message"], versions
    assert {s["name"] for s in json.loads(second.stdout)["stages"]} >= {"core", "network", "baseline"}
    assert "baseline" not in {s["name"] for s in report["stages"]}  # the first run, without --baseline, has none
