"""The monitoring role on the 3-node test cluster, after site.yml converged without it: check mode, converge
with monitoring_enabled: true, idempotence, the acceptance suite, and the end-to-end proof that the real
node_exporter it installs serves the Prometheus report a full clustercheck run wrote."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from conftest import REPO, ansible_playbook
from test_site_playbook import acceptance, changed_tasks, recap
from torchenv import ssh_client, ssh_run

pytestmark = pytest.mark.cluster

TEXTFILE_DIR = "/var/lib/prometheus/node-exporter"  # the role's default, and the package's


@pytest.fixture(scope="module")
def monitored(converged_cluster, wheelhouse, tmp_path_factory):
    """The converged cluster's inventory with monitoring switched on and admin_cidr set, as a user writes it.

    Afterwards the firewall goes back to the session's settings (the firewall role removes the rules these
    settings added), so that the tests after this module find the cluster as site.yml set it up."""
    inventory = tmp_path_factory.mktemp("monitoring-inventory")
    shutil.copy(converged_cluster.inventory, inventory / "hosts.ini")
    (inventory / "group_vars").mkdir()
    settings = {"monitoring_enabled": True, "admin_cidr": converged_cluster.subnet}
    (inventory / "group_vars" / "all.yml").write_text(yaml.safe_dump(settings))
    yield SimpleNamespace(inventory=str(inventory), nodes=converged_cluster.nodes, cluster=converged_cluster)
    restored = ansible_playbook(converged_cluster, wheelhouse, "--tags", "firewall")
    assert restored.returncode == 0, restored.stdout[-4000:]


def play(monitored, wheelhouse, *args: str) -> subprocess.CompletedProcess:
    proc = ansible_playbook(monitored, wheelhouse, *args)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    return proc


def test_check_mode_then_converge_then_nothing_changes(monitored, wheelhouse):
    play(monitored, wheelhouse, "--check", "--tags", "monitoring")  # before node_exporter is installed
    first = play(monitored, wheelhouse)
    assert "Monitoring | VERIFY | node_exporter serves metrics" in first.stdout
    second = play(monitored, wheelhouse)
    counts = recap(second.stdout)
    assert set(counts) == {n.name for n in monitored.nodes}
    assert all(c["changed"] == 0 for c in counts.values()), changed_tasks(second.stdout)


def test_acceptance_suite_checks_the_monitoring_role(monitored):
    proc = acceptance(monitored, str(REPO / "tests" / "acceptance" / "test_monitoring.py"))
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert f"{3 * len(monitored.nodes)} passed" in proc.stdout, proc.stdout[-2000:]


def scrape(address: str) -> str:
    with urllib.request.urlopen(f"http://{address}:9100/metrics", timeout=10) as response:
        return response.read().decode()


def series(text: str) -> dict[tuple[str, frozenset], str]:
    """The samples of an exposition as (name, label set) -> value: node_exporter writes the labels in its own
    order (sorted by name), not in the order of the file it read."""
    found = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, value = line.rsplit(" ", 1)
        name, _, labels = head.partition("{")
        pairs = frozenset(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', labels))
        found[(name, pairs)] = value
    return found


def status(check: str, host: str, state: str) -> tuple[str, frozenset]:
    labels = {"check": check, "host": host, "status": state, "source": "run"}
    return "clustercheck_check_status", frozenset(labels.items())


def test_node_exporter_serves_the_metrics_of_a_full_clustercheck_run(monitored, tmp_path):
    """What the README's timer does: clustercheck writes its Prometheus report (atomically) into the textfile
    directory of a node_exporter, and Prometheus finds the check statuses and the bandwidth on /metrics."""
    ssh_config = tmp_path / "ssh_config"
    ssh_config.touch()
    prom = tmp_path / "clustercheck.prom"
    proc = subprocess.run(
        [
            str(Path(sys.executable).parent / "clustercheck"),
            "run",
            "--hosts",
            monitored.inventory,
            "--ssh-config",
            str(ssh_config),
            "--run-dir",
            str(tmp_path / "run"),
            "--format",
            "prometheus",
            "-o",
            str(prom),
            "--master-port",
            "29671",
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    tool = shutil.which("promtool")
    assert tool, "promtool is not installed (apt-get install prometheus; .ci/run installs it)"
    lint = subprocess.run([tool, "check", "metrics"], input=prom.read_text(), capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout + lint.stderr

    node = monitored.cluster.node("node1")
    client = ssh_client(monitored.cluster, node)
    try:
        client.open_sftp().put(str(prom), f"{TEXTFILE_DIR}/.clustercheck.prom.tmp")
        rc, out = ssh_run(client, f"mv {TEXTFILE_DIR}/.clustercheck.prom.tmp {TEXTFILE_DIR}/clustercheck.prom")
        assert rc == 0, out
        text = scrape(node.address)
    finally:
        ssh_run(client, f"rm -f {TEXTFILE_DIR}/clustercheck.prom {TEXTFILE_DIR}/.clustercheck.prom.tmp")
        client.close()

    assert "node_textfile_scrape_error 0" in text
    lines = text.splitlines()
    scraped = series(text)
    for n in monitored.nodes:
        assert scraped.get(status("torch.import", n.name, "PASS")) == "0", n.name
    assert scraped.get(status("ddp_equivalence", "", "PASS")) == "0"
    # The Slurm health program's own verdict (source="node-health") may sit beside it in the textfile directory.
    verdicts = [labels for name, labels in scraped if name == "clustercheck_run_status"]
    assert [v for v in verdicts if ("source", "run") in v], verdicts
    busbw = [line for line in lines if line.startswith("clustercheck_allreduce_busbw_bytes_per_second{")]
    assert busbw and all(float(line.rsplit(" ", 1)[1]) > 0 for line in busbw), busbw
