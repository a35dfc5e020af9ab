"""monitoring: node_exporter from the distribution's packages serves its textfile collector directory, and the
firewall lets the admin network reach it. Checked where the inventory sets monitoring_enabled: true."""

from __future__ import annotations

import pytest
from acceptance_helpers import setting

PROBE = "clustercheck_acceptance_probe"


@pytest.fixture
def monitoring(host, runner) -> dict:
    name = host.backend.get_hostname()
    enabled = setting(runner, name, "monitoring_enabled", "monitoring")
    if str(enabled).lower() not in ("true", "yes", "1"):
        pytest.skip("monitoring_enabled is not true in the inventory: the monitoring role is not applied")
    variables = runner.get_variables(name)
    return {
        "port": int(setting(runner, name, "monitoring_port", "monitoring")),
        "textfile_dir": setting(runner, name, "monitoring_textfile_dir", "monitoring"),
        "allow_from": variables.get("monitoring_allow_from") or variables.get("admin_cidr") or "any",
        "firewall": str(setting(runner, name, "firewall_enabled", "firewall")).lower() in ("true", "yes", "1"),
    }


def metrics(host, port: int) -> str:
    fetch = f"import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:{port}/metrics').read().decode())"
    return host.check_output(f'python3 -c "{fetch}"')


def test_node_exporter_installed_running_and_enabled(host, monitoring):
    assert host.package("prometheus-node-exporter").is_installed
    service = host.service("prometheus-node-exporter")
    assert service.is_running and service.is_enabled
    assert (
        host.socket(f"tcp://0.0.0.0:{monitoring['port']}").is_listening
        or host.socket(f"tcp://:::{monitoring['port']}").is_listening
    )


def test_the_textfile_collector_serves_a_file_put_in_its_directory(host, monitoring):
    directory = monitoring["textfile_dir"]
    assert host.file(directory).is_directory
    probe = f"{directory}/{PROBE}.prom"
    host.check_output(f"printf '# TYPE {PROBE} gauge\\n{PROBE} 1\\n' > {probe}.tmp && mv {probe}.tmp {probe}")
    try:
        text = metrics(host, monitoring["port"])
    finally:
        host.run(f"rm -f {probe}")
    assert f"\n{PROBE} 1\n" in text, "node_exporter does not read the textfile directory"
    assert "node_textfile_scrape_error 0" in text


def test_the_admin_network_may_reach_node_exporter(host, monitoring):
    if not monitoring["firewall"]:
        pytest.skip("firewall_enabled is false: the firewall role leaves ufw alone")
    source = "Anywhere" if monitoring["allow_from"] in ("any", "0.0.0.0/0") else monitoring["allow_from"]
    rules = [line.split()[:3] for line in host.check_output("ufw status").splitlines()]
    assert [f"{monitoring['port']}/tcp", "ALLOW", source] in rules, f"no ufw rule lets {source} reach node_exporter"


def test_clustercheck_s_timer_is_armed_and_its_last_run_did_its_job(host, monitoring):
    """On the node that runs clustercheck's timer (monitoring_timer_host): the timer is enabled and armed, and the
    last run of its service succeeded (exit 0, or 1 for a check that failed: the metrics say which)."""
    if not host.file("/etc/systemd/system/clustercheck-monitor.timer").exists:
        pytest.skip("clustercheck's timer runs on another node (monitoring_timer_host), or monitoring_timer is false")
    timer = host.service("clustercheck-monitor.timer")
    assert timer.is_enabled and timer.is_running, "clustercheck-monitor.timer is not enabled and active"
    result = host.check_output("systemctl show -p Result --value clustercheck-monitor.service")
    journal = host.run("journalctl -u clustercheck-monitor.service -n 20 --no-pager").stdout
    assert result == "success", f"the timer's last run failed ({result}):\n{journal}"
