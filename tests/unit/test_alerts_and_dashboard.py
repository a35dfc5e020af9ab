"""The Prometheus alerting rules and the Grafana dashboard of monitoring/, held to what clustercheck writes: promtool
checks the rules and runs their unit tests (monitoring/clustercheck-alerts.test.yml), the rules fire on the series
the renderer writes for reports judged on records of real runs (tests/unit/records), every metric and label the
rules, their tests and the dashboard read is one the renderer writes, and the dashboard's queries are
docs/monitoring.md's, valid PromQL that finds data in those series. promtool is Debian's `prometheus` package;
where it is not installed the tests that need it are skipped (in CI they fail: harness.promtool_path)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from harness import probe_records, promtool_path, real_results

from clustercheck import expected
from clustercheck.checks import baseline, consistency, gpuperf, network, registry
from clustercheck.facts.model import GpuBench
from clustercheck.model import CheckResult, Status
from clustercheck.report import Report, prometheus
from clustercheck.report import json as json_report
from clustercheck.run import health
from clustercheck.slurm import breaker

REPO = Path(__file__).resolve().parent.parent.parent
MONITORING = REPO / "monitoring"
RULES = MONITORING / "clustercheck-alerts.yml"
RULE_TESTS = MONITORING / "clustercheck-alerts.test.yml"
DASHBOARD = MONITORING / "grafana-dashboard.json"
RECORDS = Path(__file__).parent / "records"
# The labels Prometheus adds to every series it scrapes: the node_exporter that served it, and its scrape job.
SCRAPE_LABELS = {"instance", "job"}

SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})? (?P<value>\S+)$")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def promtool(*args: str, cwd: Path = MONITORING) -> subprocess.CompletedProcess:
    return subprocess.run([promtool_path(), *args], cwd=cwd, capture_output=True, text=True, timeout=120)


# ------------------------------------------------------------------------------------------- the scenarios


def _records(name: str) -> tuple[list[CheckResult], list[str]]:
    """The network checks judged on a recorded probe of the 3-node test cluster, and its hosts."""
    records = probe_records(name)
    peers = [network.Peer(n, r["address"]) for n, r in sorted(records.items())]
    return network.evaluate(records, peers, "node1", 29500), sorted(records)


def firewall_cluster() -> dict[str, str]:
    """A full run where node3's firewall drops the probes (node1 and node2 FAIL network.tcp towards it), served by
    the control machine's node_exporter, and node1's health program, which reports its own checks, by node1's."""
    results = real_results()
    return {
        "head:9100": prometheus.render(Report(results, ["node1", "node2", "node3"], "x", 0, 40)),
        "node1:9100": prometheus.render(
            Report([r for r in results if r.host == "node1"], ["node1"], "y", 0, 3), source="node-health"
        ),
    }


def slowed_link_cluster() -> dict[str, str]:
    """`clustercheck run --only network --baseline`, node2's egress rate-limited since a healthy baseline: the
    network checks WARN on throughput, baseline.throughput and baseline.rtt FAIL; with the clock offsets
    consistency.clock measures (as the core stage's run reports them)."""
    healthy, hosts = _records("netprobe-healthy.json")
    slowed, _ = _records("netprobe-node2-tbf.json")
    then = baseline.Baseline(
        json_report.document(Report(healthy, hosts)), "baseline.json", baseline.parse_tolerances([])
    )
    results = slowed + baseline.evaluate(then, json_report.document(Report(slowed, hosts)))
    offsets = {"node1": 0.0004, "node2": -0.0012, "node3": 0.0021}
    measures = tuple(m for host, offset in offsets.items() for m in consistency.CLOCK_OFFSET.of(offset, host=host))
    results.append(CheckResult("consistency.clock", Status.PASS, "clocks within 0.003 s", measures=measures))
    return {"head:9100": prometheus.render(Report(results, hosts, "z", 0, 20))}


def _gpu_results(host: str, bf16: float) -> list[CheckResult]:
    """The gpu.perf.* checks of a node with two H100s, their figures in gpubench's shape (remote/gpubench.py)."""
    gpus = [
        {"index": i, "bus_id": f"00000000:{0x18 + i:02X}:00.0", "name": "NVIDIA H100 80GB HBM3", "memory_gbps": 2900}
        | {"matmul_tflops": {"bf16": bf16 if i else 700.0, "tf32": 380, "fp32": 50}, "h2d_gbps": 55, "d2h_gbps": 54}
        for i in range(2)
    ]
    bench = GpuBench.from_answer({"cuda": True, "copy_counts": "read+written", "gpus": gpus})
    match = expected.shipped().match(["NVIDIA H100 80GB HBM3"])
    return [registry.result(n, host, gpuperf.judge_node(bench, match, f, host)) for n, f in gpuperf.CHECKS.items()]


def slower_gpu_cluster() -> dict[str, str]:
    """`clustercheck run --baseline` where node2's GPU 1 multiplies bf16 at 490 TFLOP/s, 700 in the baseline: its
    gpu.perf.matmul WARNs against its node's other GPU, baseline.gpu_perf FAILs on node2."""
    hosts = ["node1", "node2"]
    healthy = [r for host in hosts for r in _gpu_results(host, 700.0)]
    slower = _gpu_results("node1", 700.0) + _gpu_results("node2", 490.0)
    then = baseline.Baseline(json_report.document(Report(healthy, hosts)), "baseline.json", baseline.DEFAULT_TOLERANCES)
    compared = baseline.evaluate(then, json_report.document(Report(slower, hosts)))
    return {"head:9100": prometheus.render(Report(slower + compared, hosts, "g", 0, 20))}


def cluster_wide_failure() -> dict[str, str]:
    """Every node's health program FAILs shm.size at once; node1's drained its node, the circuit breaker held node2's
    and node3's drains back (node-health --slurm --textfile-dir, each served by the node's node_exporter)."""
    served = {}
    for host in ("node1", "node2", "node3"):
        failed = registry.get("shm.size").result(host, registry.fail("/dev/shm is 64 MiB, less than 256 MiB"))
        held = breaker.Verdict(host, "shm.size", False, "gpu", 3, ("node1",), 1)
        extra = [health.drain_withheld(held)] if host != "node1" else []
        served[f"{host}:9100"] = prometheus.render(Report([failed], [host], host, 0, 3), "node-health", extra)
    return served


SCENARIOS = {
    "firewall": firewall_cluster,
    "slowed link": slowed_link_cluster,
    "slower GPU": slower_gpu_cluster,
    "cluster-wide failure": cluster_wide_failure,
}


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    out = []
    for line in text.splitlines():
        if line and not line.startswith("#"):
            match = SAMPLE.match(line)
            assert match, line
            out.append((match["name"], dict(LABEL.findall(match["labels"] or "")), float(match["value"])))
    return out


def input_series(served: dict[str, str], minutes: int) -> list[dict]:
    """The renderer's samples as Prometheus scrapes them (with instance and job), the same value every minute."""
    series = []
    for instance, text in served.items():
        for name, labels, value in samples(text):
            labels = {**labels, "instance": instance, "job": "node"}
            pairs = ",".join(f"{k}={json.dumps(v)}" for k, v in labels.items())
            series.append({"series": f"{name}{{{pairs}}}", "values": f"{value:g}x{minutes}"})
    return series


def rule_test(tmp_path: Path, series: list[dict], exprs: list[dict]) -> subprocess.CompletedProcess:
    shutil.copy(RULES, tmp_path / RULES.name)
    tests = {
        "rule_files": [RULES.name],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": series, "promql_expr_test": exprs}],
    }
    (tmp_path / "test.yml").write_text(json.dumps(tests))
    return promtool("test", "rules", "test.yml", cwd=tmp_path)


# ------------------------------------------------------------------------------------------- the rules


def test_promtool_accepts_the_rules_and_their_unit_tests_pass():
    checked = promtool("check", "rules", RULES.name)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = promtool("test", "rules", RULE_TESTS.name)
    assert tested.returncode == 0, tested.stdout + tested.stderr


def alert(name: str, severity: str, **labels: str) -> dict:
    pairs = ",".join(f'{k}="{v}"' for k, v in {"alertname": name, "alertstate": "firing", **labels}.items())
    return {"labels": f'ALERTS{{{pairs},severity="{severity}"}}', "value": 1}


def test_the_alerts_fire_on_the_series_the_renderer_writes(tmp_path):
    """node3's firewall: node1 and node2 are not ready (network.tcp), one alert each though node1's health program
    reports it too; the slowed link: two figures far below the baseline, the throughput WARN no alert. Both
    reports started at time 0: at 40 minutes they are stale."""
    firing = 'ALERTS{alertstate="firing"}'
    node_health = {"source": "node-health", "instance": "node1:9100", "job": "node", "host": "node1"}
    stale_run = alert("ClustercheckRunStale", "warning", source="run", instance="head:9100", job="node")
    expected = {
        "firewall": [
            alert("ClustercheckNodeNotReady", "critical", host="node1", check="network.tcp"),
            alert("ClustercheckNodeNotReady", "critical", host="node2", check="network.tcp"),
        ],
        "slowed link": [
            alert("ClustercheckBelowBaseline", "critical", check="baseline.rtt"),
            alert("ClustercheckBelowBaseline", "critical", check="baseline.throughput"),
        ],
        "slower GPU": [alert("ClustercheckBelowBaseline", "critical", check="baseline.gpu_perf", host="node2")],
        "cluster-wide failure": [
            alert("ClustercheckDrainWithheld", "critical", check="shm.size"),
            *(alert("ClustercheckNodeNotReady", "critical", check="shm.size", host=f"node{n}") for n in (1, 2, 3)),
        ],
    }
    stale = {
        "firewall": [stale_run, alert("ClustercheckNodeHealthStale", "warning", **node_health)],
        "slowed link": [stale_run],
        "slower GPU": [stale_run],
        "cluster-wide failure": [
            alert("ClustercheckNodeHealthStale", "warning", **node_health),
            *(
                alert(
                    "ClustercheckNodeHealthStale",
                    "warning",
                    **{**node_health, "instance": f"node{n}:9100", "host": f"node{n}"},
                )
                for n in (2, 3)
            ),
        ],
    }
    for scenario, build in SCENARIOS.items():
        exprs = [
            {"expr": firing, "eval_time": "10m", "exp_samples": expected[scenario]},
            {"expr": firing, "eval_time": "40m", "exp_samples": expected[scenario] + stale[scenario]},
        ]
        proc = rule_test(tmp_path, input_series(build(), 45), exprs)
        assert proc.returncode == 0, f"{scenario}: {proc.stdout}{proc.stderr}"


def rule_exprs() -> list[str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule["expr"] for group in groups for rule in group["rules"]]


def rule_templates() -> list[str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [
        text
        for group in groups
        for rule in group["rules"]
        for text in [*rule.get("labels", {}).values(), *rule.get("annotations", {}).values()]
    ]


def dashboard_targets() -> list[dict]:
    return [target for panel in json.loads(DASHBOARD.read_text())["panels"] for target in panel["targets"]]


def rendered() -> list[tuple[str, dict[str, str], float]]:
    return [s for build in SCENARIOS.values() for text in build().values() for s in samples(text)]


def test_every_metric_and_label_the_rules_and_the_dashboard_read_is_one_the_renderer_writes():
    written = rendered()
    names = {name for name, _, _ in written}
    labels = {label for _, own, _ in written for label in own} | SCRAPE_LABELS
    values = {label: {own[label] for _, own, _ in written if label in own} for label in labels}
    exprs = rule_exprs() + [t["expr"] for t in dashboard_targets()]
    used_names = {name for expr in exprs for name in re.findall(r"\b(clustercheck_\w+)", expr)}
    assert used_names and used_names <= names, used_names - names
    matchers = [m for expr in exprs for m in re.findall(r'(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"', expr)]
    grouped = {g.strip() for expr in exprs for group in re.findall(r"\(([\w\s,]+)\)", expr) for g in group.split(",")}
    legends = {g for t in dashboard_targets() for g in re.findall(r"\{\{\s*(\w+)\s*\}\}", t.get("legendFormat", ""))}
    templated = {g for text in rule_templates() for g in re.findall(r"\$labels\.(\w+)", text)}
    used_labels = {label for label, _, _ in matchers} | grouped | legends | templated
    assert used_labels - labels == set()
    for label, op, value in matchers:
        if label == "check" and op in ("=~", "!~"):  # a pattern of check names: it names some check
            assert any(re.fullmatch(value, name) for name in registry.REGISTRY), value
        elif label == "status" and op in ("=~", "!~"):
            assert set(value.split("|")) <= {s.value for s in Status}, value
        elif value:  # an exact value: one the renderer writes
            assert value in values[label], (label, value)


def test_the_rule_tests_series_are_shaped_as_the_renderer_writes_them():
    """The hand-written input series of the rules' unit tests: each is a metric the renderer writes, with its label
    names and Prometheus' scrape labels, and a status gauge's value is its status label's."""
    written: dict[str, set[frozenset]] = {}
    for name, own, _ in rendered():
        written.setdefault(name, set()).add(frozenset(own) | SCRAPE_LABELS)
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    series = [s for test in tests for s in test["input_series"]]
    assert series
    for entry in series:
        name, labels = entry["series"].split("{", 1)
        own = dict(LABEL.findall(labels))
        assert name in written and frozenset(own) in written[name], entry["series"]
        assert own["source"] in prometheus.SOURCES, entry["series"]
        if name == "clustercheck_check_status":
            first = entry["values"].split()[0].split("x")[0]
            assert first == "_" or float(first) == prometheus.STATUS_VALUES[Status(own["status"])], entry


# ------------------------------------------------------------------------------------------- the dashboard


def documented_queries() -> list[str]:
    text = (REPO / "docs" / "monitoring.md").read_text()
    block = text.split("Grafana-ready queries (PromQL):", 1)[1].split("```text\n", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line and not line.startswith("#")]


def test_the_dashboard_is_provisionable_with_a_prometheus_datasource_variable():
    dashboard = json.loads(DASHBOARD.read_text())
    assert isinstance(dashboard["schemaVersion"], int) and dashboard["uid"] and dashboard["title"]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    datasource = {"type": "prometheus", "uid": "${datasource}"}
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    for panel in panels:
        assert panel["datasource"] == datasource and panel["targets"], panel["title"]
        assert all(t["datasource"] == datasource for t in panel["targets"]), panel["title"]
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]


def test_the_dashboard_queries_are_the_documented_ones_and_find_data_in_what_the_renderer_writes(tmp_path):
    exprs = [t["expr"] for t in dashboard_targets()]
    assert set(exprs) <= set(documented_queries())  # each of which is valid PromQL (the test below)
    # each query returns data for one of the reports: `count(...) > bool 0` is 1 then, nothing otherwise
    series = {scenario: input_series(build(), 10) for scenario, build in SCENARIOS.items()}
    for expr in exprs:
        finds = {"expr": f"count({expr}) > bool 0", "eval_time": "5m", "exp_samples": [{"labels": "{}", "value": 1}]}
        found = [s for s in SCENARIOS if rule_test(tmp_path, series[s], [finds]).returncode == 0]
        assert found, expr


@pytest.mark.parametrize("query", documented_queries())
def test_every_documented_query_is_valid_promql(query, tmp_path):
    rules = {"groups": [{"name": "readme", "rules": [{"record": "readme:query", "expr": query}]}]}
    (tmp_path / "query.yml").write_text(yaml.safe_dump(rules))
    checked = promtool("check", "rules", "query.yml", cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
