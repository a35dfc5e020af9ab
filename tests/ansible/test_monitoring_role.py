"""The monitoring role on the 3-node test cluster, after site.yml converged without it: check mode, converge
with monitoring_enabled: true, idempotence, the acceptance suite, the end-to-end proof that the real
node_exporter it installs serves the Prometheus report a full clustercheck run wrote, and that the role's timer
makes a real Prometheus, loaded with the shipped alerting rules, fire an alert for a fault on one node and resolve
it once the fault is undone."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from conftest import REPO, ansible_playbook
from harness import on
from test_site_playbook import acceptance, changed_tasks, recap
from torchenv import ssh_client, ssh_run

pytestmark = pytest.mark.cluster

TEXTFILE_DIR = "/var/lib/prometheus/node-exporter"  # the role's default, and the package's
TIMER = "clustercheck-monitor.timer"
SERVICE = "clustercheck-monitor.service"
ALERTS = REPO / "monitoring" / "clustercheck-alerts.yml"


@pytest.fixture(scope="module")
def monitored(converged_cluster, wheelhouse, tmp_path_factory):
    """The converged cluster's inventory with monitoring switched on and admin_cidr set, as a user writes it.

    Afterwards the firewall goes back to the session's settings (the firewall role removes the rules these
    settings added), so that the tests after this module find the cluster as site.yml set it up."""
    inventory = tmp_path_factory.mktemp("monitoring-inventory")
    shutil.copy(converged_cluster.inventory, inventory / "hosts.ini")
    (inventory / "group_vars").mkdir()
    # The timer's interval is long enough that it starts no run of its own while the tests run clustercheck: only its
    # first run (right after the converge) and the runs test_the_timer_makes_prometheus_fire started by hand.
    settings = {"monitoring_enabled": True, "admin_cidr": converged_cluster.subnet, "monitoring_interval": "2h"}
    (inventory / "group_vars" / "all.yml").write_text(yaml.safe_dump(settings))
    yield SimpleNamespace(inventory=str(inventory), nodes=converged_cluster.nodes, cluster=converged_cluster)
    # No timer run may overlap the later modules' runs (their leftover checks would see it).
    on(converged_cluster.nodes[0], f"systemctl disable --now {TIMER} 2>/dev/null; true")
    restored = ansible_playbook(converged_cluster, wheelhouse, "--tags", "firewall")
    assert restored.returncode == 0, restored.stdout[-4000:]


def play(monitored, wheelhouse, *args: str) -> subprocess.CompletedProcess:
    proc = ansible_playbook(monitored, wheelhouse, *args)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    return proc


# The roles that read what `monitored` changes (monitoring_enabled, admin_cidr): site.yml's other roles are proved
# idempotent on this cluster by test_site_playbook and do not read these settings (a full run here would only repeat
# them, at two minutes a run).
READERS = "monitoring,slurm,firewall,containers"


def test_the_roles_that_read_the_monitoring_settings_are_the_ones_it_converges():
    readers = {
        path.relative_to(REPO / "roles").parts[0]
        for path in (REPO / "roles").rglob("*")
        if path.is_file() and re.search(r"\b(monitoring_\w+|admin_cidr)\b", path.read_text())
    }
    assert readers == set(READERS.split(",")), readers


def test_check_mode_then_converge_then_nothing_changes(monitored, wheelhouse):
    play(monitored, wheelhouse, "--check", "--tags", "monitoring")  # before node_exporter is installed
    first = play(monitored, wheelhouse, "--tags", READERS)
    assert "Monitoring | VERIFY | node_exporter serves metrics" in first.stdout
    second = play(monitored, wheelhouse, "--tags", READERS)
    counts = recap(second.stdout)
    assert set(counts) == {n.name for n in monitored.nodes}
    assert all(c["changed"] == 0 for c in counts.values()), changed_tasks(second.stdout)


def test_acceptance_suite_checks_the_monitoring_role(monitored):
    proc = acceptance(monitored, str(REPO / "tests" / "acceptance" / "test_monitoring.py"))
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    # the timer's test passes on node1 and is skipped on the others (the timer is on node1 only)
    assert f"{3 * len(monitored.nodes) + 1} passed, {len(monitored.nodes) - 1} skipped" in proc.stdout, proc.stdout[
        -2000:
    ]


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
    """What the monitoring timer does (docs/monitoring.md): clustercheck writes its Prometheus report (atomically)
    into the textfile directory of a node_exporter, and Prometheus finds the check statuses and the bandwidth on
    /metrics."""
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


@contextlib.contextmanager
def prometheus(tmp_path: Path, targets: list[str], rules: Path):
    """A real Prometheus (Debian's package) on this machine scraping TARGETS every second with RULES loaded, evaluated
    every second; yields its API's base URL."""
    binary = shutil.which("prometheus")
    assert binary, "prometheus is not installed (apt-get install prometheus; .ci/run installs it)"
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rules)],
        "scrape_configs": [{"job_name": "node", "static_configs": [{"targets": targets}]}],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    log = (tmp_path / "prometheus.log").open("w")
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()[-3000:]
            with contextlib.suppress(OSError), urllib.request.urlopen(f"{url}/-/ready", timeout=2) as response:
                if response.status == 200:
                    break
            assert time.monotonic() < deadline, "Prometheus was not ready within 60 s"
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def api(url: str, path: str) -> list[dict]:
    with urllib.request.urlopen(f"{url}/api/v1/{path}", timeout=10) as response:
        body = json.load(response)
    assert body["status"] == "success", body
    return body["data"]["alerts"] if path == "alerts" else body["data"]["result"]


def wait_for(what: str, probe, timeout: float = 90):
    """PROBE's first true answer within TIMEOUT seconds; fails naming WHAT and the last answer otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        answer = probe()
        if answer:
            return answer
        assert time.monotonic() < deadline, f"{what} not within {timeout:.0f} s (last: {answer!r})"
        time.sleep(1)


def timer_run(node) -> dict:
    """One run of the timer's service, started as the timer starts it, and its report.json."""
    on(node, f"systemctl start {SERVICE}", timeout=600)
    result = on(node, f"systemctl show -p Result --value {SERVICE}").stdout.strip()
    assert result == "success", on(node, f"journalctl -u {SERVICE} -n 40 --no-pager", check=False).stdout
    return json.loads(on(node, "cat /var/lib/clustercheck/monitor/last/report.json").stdout)


def test_the_timer_makes_prometheus_fire_an_alert_for_a_fault_and_resolve_it(monitored, tmp_path):
    """The role's timer on node1 runs clustercheck's light stages over the cluster into node1's textfile directory;
    a real Prometheus scraping the nodes with the shipped rules fires ClustercheckNodeNotReady for node2 once chrony
    is stopped there (time.sync FAIL), and resolves it after chrony runs again and the timer's next report is clean.

    The rules' one window (max_over_time over 5 minutes, so that a missed scrape does not resolve an alert) is 20 s
    here: the same rules, resolved within the test's time."""
    node1, node2 = monitored.nodes[0], monitored.nodes[1]
    assert on(node1, f"systemctl is-enabled {TIMER}").stdout.strip() == "enabled"
    assert on(node1, f"systemctl is-active {TIMER}").stdout.strip() == "active"
    assert on(node2, f"test -e /etc/systemd/system/{TIMER}", check=False).returncode != 0  # one timer, on node1

    rules = tmp_path / "clustercheck-alerts.yml"
    rules.write_text(ALERTS.read_text().replace("[5m]", "[20s]"))
    lint = subprocess.run([shutil.which("promtool") or "promtool", "check", "rules", str(rules)], capture_output=True)
    assert lint.returncode == 0, lint.stdout + lint.stderr

    def not_ready(alerts: list[dict]) -> list[dict]:
        return [a for a in alerts if a["labels"]["alertname"] == "ClustercheckNodeNotReady"]

    healthy = timer_run(node1)
    assert [c for c in healthy["checks"] if c["status"] in ("FAIL", "ERROR")] == []
    # No torch job beside users' training: the node-local collectives are skipped (monitoring_timer_skip).
    local = [c for c in healthy["checks"] if c["name"].startswith("local.")]
    assert local and all(c["status"] == "SKIP" for c in local), local
    with prometheus(tmp_path, [f"{n.address}:9100" for n in monitored.nodes], rules) as url:
        run_start = "clustercheck_run_start_time_seconds{source='run'}"
        wait_for("the timer's report scraped from node1", lambda: api(url, f"query?query={run_start}"))
        time.sleep(3)  # a few evaluations
        assert not_ready(api(url, "alerts")) == []

        on(node2, "systemctl stop chrony")
        try:
            faulty = timer_run(node1)
            failed = {(c["name"], c.get("host")) for c in faulty["checks"] if c["status"] in ("FAIL", "ERROR")}
            assert ("time.sync", "node2") in failed, failed
            firing = wait_for(
                "ClustercheckNodeNotReady firing for node2",
                lambda: [
                    a for a in not_ready(api(url, "alerts"))
                    if a["state"] == "firing" and a["labels"].get("host") == "node2"
                ],
            )  # fmt: skip
            assert {a["labels"]["check"] for a in firing} == {"time.sync"}, firing
            assert firing[0]["labels"]["severity"] == "critical"
            assert "node2 is not ready: time.sync FAIL" in firing[0]["annotations"]["summary"]
        finally:
            on(node2, "systemctl start chrony")

        def synced_again() -> bool:  # chronyd takes a few seconds to synchronize again (WARN until then)
            report = timer_run(node1)
            return [c["status"] for c in report["checks"] if c["name"] == "time.sync" and c["host"] == "node2"]

        wait_for("time.sync PASS on node2 once chrony runs", lambda: synced_again() == ["PASS"], timeout=180)
        wait_for("ClustercheckNodeNotReady resolved", lambda: not_ready(api(url, "alerts")) == [], timeout=60)


@contextlib.contextmanager
def settings_changed(monitored, **changes):
    """The inventory's group_vars with CHANGES while the block runs, as they were afterwards."""
    path = Path(monitored.inventory) / "group_vars" / "all.yml"
    settings = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**settings, **changes}))
    try:
        yield
    finally:
        path.write_text(yaml.safe_dump(settings))


def test_a_link_slowed_below_the_baseline_fires_the_baseline_alert(monitored, wheelhouse, tmp_path):
    """A healthy report of the timer's becomes the baseline that monitoring_timer_args hands to its runs; once node2's
    egress is shaped to 50 Mbit/s (a link renegotiated at a lower speed), the timer's run finds node2's throughput far
    below the baseline, and Prometheus fires ClustercheckBelowBaseline (critical) for baseline.throughput."""
    node1, node2 = monitored.nodes[0], monitored.nodes[1]
    timer_run(node1)
    on(node1, "cp /var/lib/clustercheck/monitor/last/report.json /var/lib/clustercheck/baseline.json")
    with settings_changed(monitored, monitoring_timer_args=["--baseline", "/var/lib/clustercheck/baseline.json"]):
        play(monitored, wheelhouse, "--tags", "monitoring")
        assert "--baseline /var/lib/clustercheck/baseline.json" in on(node1, f"systemctl cat {SERVICE}").stdout
        with prometheus(tmp_path, [f"{n.address}:9100" for n in monitored.nodes], ALERTS) as url:
            on(node2, "tc qdisc add dev eth0 root tbf rate 50mbit burst 64kb latency 50ms")
            try:
                report = timer_run(node1)
            finally:
                on(node2, "tc qdisc del dev eth0 root")
            throughput = next(c for c in report["checks"] if c["name"] == "baseline.throughput")
            assert throughput["status"] == "FAIL", throughput
            assert re.search(r"node2 -> node[13] throughput \d+ Mbit/s, baseline", throughput["message"]), throughput
            firing = wait_for(
                "ClustercheckBelowBaseline firing for baseline.throughput",
                lambda: [
                    a for a in api(url, "alerts")
                    if a["labels"]["alertname"] == "ClustercheckBelowBaseline" and a["state"] == "firing"
                    and a["labels"]["check"] == "baseline.throughput"
                ],
            )  # fmt: skip
            assert firing[0]["labels"]["severity"] == "critical", firing
    play(monitored, wheelhouse, "--tags", "monitoring")  # the timer without the baseline again


def test_a_timer_turned_off_is_removed(monitored, wheelhouse):
    """monitoring_timer: false stops the timer and removes its units; the next run changes nothing."""
    node1 = monitored.nodes[0]
    with settings_changed(monitored, monitoring_timer=False):
        play(monitored, wheelhouse, "--tags", "monitoring")
        assert on(node1, f"ls /etc/systemd/system/{TIMER} /etc/systemd/system/{SERVICE}", check=False).returncode != 0
        assert "clustercheck-monitor" not in on(node1, "systemctl list-timers --all").stdout
        again = play(monitored, wheelhouse, "--tags", "monitoring")
        assert all(c["changed"] == 0 for c in recap(again.stdout).values()), changed_tasks(again.stdout)
