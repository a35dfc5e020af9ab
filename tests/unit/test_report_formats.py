"""The Prometheus and Markdown reports, rendered from check results judged on records of real runs
(tests/unit/records: a 2x2 gloo collectives job, a 3-rank DDP job, network probes of the Docker test cluster)."""

from __future__ import annotations

import json
import re
import subprocess
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
from harness import probe_records, promtool_path, real_results
from wording import says

from clustercheck import report
from clustercheck.checks import network, registry
from clustercheck.model import CheckResult, Metric, Status
from clustercheck.report import FORMAT_NAMES, Report, markdown, prometheus
from clustercheck.report import json as json_report
from clustercheck.report import text as text_report

RECORDS = Path(__file__).parent / "records"
SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})? (?P<value>\S+)$")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def load(name: str):
    return json.loads((RECORDS / name).read_text())


def samples(text: str, source: str = "run") -> list[tuple[str, dict[str, str], float]]:
    """The samples of a text exposition: (name, labels, value), each checked to carry `source` (the command that
    wrote it), which is left out of the labels returned."""
    out = []
    for line in text.splitlines():
        if line.startswith("#") or not line:
            continue
        match = SAMPLE.match(line)
        assert match, f"not a sample line: {line!r}"
        labels = {k: bytes(v, "utf-8").decode("unicode_escape") for k, v in LABEL.findall(match["labels"] or "")}
        assert labels.pop("source", None) == source, line
        out.append((match["name"], labels, float(match["value"])))
    return out


def promtool(text: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """`promtool check metrics` (Debian's prometheus package): the exposition parses and follows the naming
    conventions. CI installs it (.ci/run); elsewhere a machine without it skips."""
    # with the newline the CLI ends every report with
    return subprocess.run(
        [promtool_path(), "check", "metrics"], input=text + "\n", capture_output=True, text=True, timeout=60
    )


def test_every_format_is_offered_and_renders():
    document = Report(real_results(), ["node1", "node2", "node3"], "abc123", 1_700_000_000.0, 42.5)
    assert {"markdown", "prometheus"} <= set(FORMAT_NAMES)
    for fmt in FORMAT_NAMES:
        assert report.render(document, fmt)


def test_prometheus_has_a_status_per_check_and_host_and_the_busbw_per_size(tmp_path):
    results = real_results()
    report = Report(results, ["node1", "node2", "node3"], "abc123", 1_700_000_000.0, 42.5)
    text = prometheus.render(report)
    proc = promtool(text, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = samples(text)

    status = {(lab["check"], lab["host"]): (lab["status"], v) for n, lab, v in got if n == "clustercheck_check_status"}
    # node3's firewall drops the probes: node1 and node2 each fail network.tcp towards it, one series each.
    assert status[("network.tcp", "node1")] == ("FAIL", 3)
    assert status[("network.tcp", "node2")] == ("FAIL", 3)
    assert status[("allreduce.bandwidth", "")] == ("PASS", 0)
    assert status[("ddp_equivalence", "")] == ("PASS", 0)
    assert {(r.name, r.host or "") for r in results} == set(status)
    assert ("clustercheck_run_status", {"status": "FAIL"}, 3) in got
    assert ("clustercheck_run_start_time_seconds", {}, 1_700_000_000.0) in got
    assert ("clustercheck_run_duration_seconds", {}, 42.5) in got

    sweep = next(r for r in results if r.name == "allreduce.bandwidth").data["sizes"]
    busbw = {
        (lab["check"], lab["host"], int(lab["size_bytes"])): v
        for n, lab, v in got
        if n == "clustercheck_allreduce_busbw_bytes_per_second"
    }
    for row in sweep:
        assert busbw[("allreduce.bandwidth", "", row["bytes"])] == pytest.approx(row["busbw_gbps"] * 1e9)
    intra = [r for r in results if r.name == "allreduce.bandwidth.intra_node"]
    assert intra and all(("allreduce.bandwidth.intra_node", r.host, r.data["peak_bytes"]) in busbw for r in intra)
    ddp_data = next(r for r in results if r.name == "ddp_equivalence").data
    assert ("clustercheck_ddp_max_abs_param_diff", {}, ddp_data["max_abs_param_diff"]) in got
    mtu = {lab["host"]: v for n, lab, v in got if n == "clustercheck_network_mtu_bytes"}
    assert mtu == {"node1": 1500, "node2": 1500, "node3": 1500}


def test_prometheus_gives_an_unknown_check_its_status_only_and_escapes_labels(tmp_path):
    odd = [
        CheckResult('gpu.new"check', Status.WARN, "m", host="node\\1\nx", data={"sizes": "not a list"}),
        CheckResult("allreduce.bandwidth", Status.SKIP, "no bandwidth results: sweep not run"),
        CheckResult("consistency.clock", Status.SKIP, "one node", data={"offsets_s": {"node1": None}}),
        CheckResult("ddp_equivalence", Status.ERROR, "rank died", data={"scaling_efficiency": None}),
        # data of another shape than today's checks write: no measurement, and no crash
        CheckResult("allreduce.bandwidth.intra_node", Status.PASS, "m", host="node1", data={"sizes": 3}),
        CheckResult("allreduce.bandwidth", Status.PASS, "m", data={"sizes": [{"bytes": float("nan")}, "x"]}),
        CheckResult("network.mtu", Status.PASS, "m", data={"mtu": [1500], "interface": "eth0"}),
        CheckResult("consistency.clock", Status.PASS, "m", data={"offsets_s": "0.1"}),
    ]
    text = prometheus.render(Report(odd, ["node1"]))
    proc = promtool(text, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = samples(text)
    assert {n for n, _, _ in got} == {
        "clustercheck_run_status",
        "clustercheck_run_hosts",
        "clustercheck_check_status",
        "clustercheck_checks",
    }
    assert ("clustercheck_check_status", {"check": 'gpu.new"check', "host": "node\\1\nx", "status": "WARN"}, 2) in got


def test_a_run_report_and_node_health_on_one_node_repeat_no_series(tmp_path):
    # node_exporter refuses a series that two files of its textfile directory repeat; the head node holds the
    # timer's `clustercheck run` report and its own node-health results, whose checks and hosts overlap.
    results = real_results()
    own = [r for r in results if r.host == "node1"]
    files = {
        "run": prometheus.render(Report(results, ["node1", "node2", "node3"], "x", 1, 2)),
        "node-health": prometheus.render(Report(own, ["node1"], "y", 1, 2), source="node-health"),
    }
    series = [
        (name, tuple(sorted(labels.items())), source)
        for source, text in files.items()
        for name, labels, _ in samples(text, source)
    ]
    assert len(set(series)) == len(series)
    overlap = {(n, labels) for n, labels, s in series if s == "run"} & {
        (n, labels) for n, labels, s in series if s == "node-health"
    }
    assert ("clustercheck_run_status", (("status", "FAIL"),)) in overlap  # without the label they would collide
    for text in files.values():
        proc = promtool(text, tmp_path)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    with pytest.raises(ValueError):
        prometheus.render(Report(own, ["node1"]), source="cron")


def test_markdown_puts_the_verdict_and_the_failures_with_their_fixes_first():
    results = real_results()
    text = markdown.render(Report(results, ["node1", "node2", "node3"], "abc123", 0.0, 75))
    lines = text.splitlines()
    assert lines[0] == "## clustercheck: NOT READY: 2 check(s) failed"  # contract: the verdict line
    assert "3 host(s)" in lines[2] and "took 1m15s" in lines[2]
    failures = text.index("### Failures")
    fix = text.index("  - fix: On node3, allow TCP from the cluster network")
    assert failures < fix < text.index("### Checks")
    rows = [line for line in lines if line.startswith("| `")]
    assert len(rows) == len({r.name for r in results})  # one row per check, whatever the host count
    tcp = next(row for row in rows if row.startswith("| `network.tcp`"))
    assert "FAIL: node1, node2" in tcp and "\n" not in tcp
    assert all(row.count(" | ") == 2 for row in rows)  # pipes in messages are escaped


def test_markdown_s_next_step_comes_after_the_warnings_it_tells_to_read():
    """`Next: read the warnings above, then train` stood above the Warnings section it meant."""
    healthy = probe_records("netprobe-healthy.json")
    from clustercheck.checks import collectives, ddp

    peers = [network.Peer(n, r["address"]) for n, r in sorted(healthy.items())]
    results = network.evaluate(healthy, peers, "node1", 29500)
    results += collectives.evaluate_bandwidth(load("collectives-2x2.json"), world_size=4)
    results.append(ddp.evaluate(load("ddp-pass.json"), world_size=3))
    results += [
        registry.get("time.sync").result(h, registry.warn("the clock is not synchronized to NTP")) for h in healthy
    ]
    lines = markdown.render(Report(results, sorted(healthy))).splitlines()
    assert lines[0] == "## clustercheck: READY for multi-node PyTorch (with warnings)"  # contract: the verdict line
    (next_line,) = [line for line in lines if line.startswith("Next: ")]
    assert next_line.startswith("Next: read the warnings above, then train: ")
    warnings = lines.index("### Warnings")
    assert warnings < lines.index("- **WARN** `time.sync` on `node3`: node3: the clock is not synchronized to NTP")
    assert (
        lines.index("- **WARN** `time.sync` on `node3`: node3: the clock is not synchronized to NTP")
        < lines.index(next_line)
        < lines.index("### Checks")
    )


MONITORING_DOC = Path(__file__).resolve().parent.parent.parent / "docs" / "monitoring.md"


def test_every_pair_s_round_trip_and_throughput_are_metrics():
    records = probe_records("netprobe-node2-tbf.json")
    peers = [network.Peer(n, r["address"]) for n, r in sorted(records.items())]
    results = network.evaluate(records, peers, "node1", 29500)
    got = samples(prometheus.render(Report(results, sorted(records), "x", 1, 2)))
    rtt = {(lab["host"], lab["peer"]): v for n, lab, v in got if n == "clustercheck_network_rtt_seconds"}
    rate = {
        (lab["host"], lab["peer"]): v for n, lab, v in got if n == "clustercheck_network_throughput_bytes_per_second"
    }
    assert len(rtt) == 3 and all(0 < v < 1 for v in rtt.values())  # three pairs, in seconds
    assert len(rate) == 6  # both directions of every pair
    slowest = min(rate, key=rate.get)
    assert slowest[0] == "node2"  # the node whose link was rate-limited sends slowest


def test_the_monitoring_doc_names_every_metric():
    doc = MONITORING_DOC.read_text()
    names = {
        n for n, _, _ in samples(prometheus.render(Report(real_results(), ["node1", "node2", "node3"], "x", 1, 2)))
    }
    names |= {"clustercheck_clock_offset_seconds"}  # from a consistency.clock result, not in these records
    names |= {"clustercheck_network_rtt_seconds", "clustercheck_network_throughput_bytes_per_second"}
    assert {n for n in names if f"`{n}`" not in doc} == set()


def test_the_documented_query_for_failing_nodes_finds_them(tmp_path):
    """docs/monitoring.md's Grafana query, evaluated by Prometheus' own rule engine (promtool test rules) on the
    metrics of a run where node3's firewall drops the probes: node1 and node2 fail network.tcp towards it."""
    lines = MONITORING_DOC.read_text().splitlines()
    query = lines[
        lines.index(
            "# Nodes failing any check (a table panel: one row per node, the value is how many checks fail there)"
        )
        + 1
    ]
    results = real_results()
    # node1's health program reports its own checks too: a check failing in both counts once.
    text = "\n".join(
        (
            prometheus.render(Report(results, ["node1", "node2", "node3"], "x", 1, 2)),
            prometheus.render(Report([r for r in results if r.host == "node1"], ["node1"]), source="node-health"),
        )
    )
    series = [
        {"series": line.rsplit(" ", 1)[0], "values": line.rsplit(" ", 1)[1]}
        for line in text.splitlines()
        if line and not line.startswith("#")
    ]
    (tmp_path / "rules.yml").write_text("groups: []\n")
    tests = {
        "rule_files": ["rules.yml"],
        "tests": [
            {
                "interval": "1m",
                "input_series": series,
                "promql_expr_test": [
                    {
                        "expr": query,
                        "eval_time": "0m",
                        "exp_samples": [
                            {"labels": '{host="node1"}', "value": 1},
                            {"labels": '{host="node2"}', "value": 1},
                        ],
                    }
                ],
            }
        ],
    }
    (tmp_path / "test.yml").write_text(json.dumps(tests))
    proc = subprocess.run(
        [promtool_path(), "test", "rules", "test.yml"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


# ------------------------------------------------------------------------------------------- the text report


def one_node_core_only() -> list[CheckResult]:
    """What `clustercheck run --hosts localhost --only core` reports on the development machine (no GPU): its
    recorded facts judged by every per-node and consistency check, and every other stage's checks skipped."""
    from clustercheck.checks import registry
    from clustercheck.facts import collect
    from clustercheck.inventory import Node

    raw = json.loads((RECORDS / "facts-debian12-localhost.json").read_text())
    facts = collect.build(Node(name="localhost", address="localhost"), raw, python="python3", python_source="x")
    results = [registry.get("connect").result("localhost", registry.passed("local"))]
    results += registry.run_node_checks(facts)
    results += registry.run_cluster_checks([facts], None)
    from clustercheck.selection import Selection, stage

    only_core = Selection(only=("core",))
    for check in registry.REGISTRY.values():
        if check.stage != "core" and stage(check.stage).asked_by is None:  # baseline: nothing without --baseline
            results += registry.skipped(check, ["localhost"], only_core.why_not_stage(check.stage))
    return results


def text_lines(document: Report) -> list[str]:
    return report.render(document, "text").splitlines()


def test_the_text_report_shows_problems_first_and_folds_the_skips_into_one_line_per_reason():
    results = one_node_core_only()
    skips = [r for r in results if r.status is Status.SKIP]
    assert len(skips) > len(results) / 2  # most of a one-node --only core run is SKIP: none of it is a row
    lines = text_lines(Report(results, ["localhost"], durations={"core": 21.3}))
    rows = [line for line in lines if line.startswith("│")]
    statuses = [row.split("│")[1].strip() for row in rows if row.split("│")[1].strip()]
    assert "SKIP" not in statuses
    order = {"ERROR": 0, "FAIL": 1, "WARN": 2, "PASS": 3}
    assert statuses == sorted(statuses, key=order.get) and statuses[0] in ("FAIL", "WARN")
    no_gpu = sum(1 for r in skips if r.message.endswith("no NVIDIA GPU on this node (none expected)"))
    no_gpu_line = f"{no_gpu} skipped: no NVIDIA GPU on this node (none expected)"
    assert f"{no_gpu_line} (torch.*, gpu.*, pcie.*, fabric.peermem)" in lines
    deselected = sum(1 for r in skips if r.message.endswith("not selected (--only core)"))
    (line,) = [line for line in lines if line.startswith(f"{deselected} skipped: not selected (--only core) (")]
    assert "network.*" in line and "ddp_equivalence" in line
    compared = sum(1 for r in skips if r.message == "one node, nothing to compare")
    assert compared == len([r for r in results if r.name.startswith("consistency.")])
    assert f"{compared} skipped: one node, nothing to compare (consistency.*)" in lines
    folded = [line for line in lines if " skipped: " in line and not line.startswith("stages:")]
    assert sum(int(line.split(" ", 1)[0]) for line in folded) == len(skips)
    assert says(lines[-4], "stages: core WARN in 21.3 s", "network, data, collectives, ddp, lightning skipped")
    assert says(lines[-4], "not selected (--only core)")
    counts = Counter(r.status for r in results)
    assert says(lines[-3], f"{len(results)} result(s)", f"{counts[Status.WARN]} WARN", f"{counts[Status.PASS]} PASS")
    assert says(lines[-3], f"{len(skips)} SKIP", "1 host(s)")


def test_only_core_is_not_called_ready_and_the_next_step_says_what_to_run():
    lines = text_lines(Report(one_node_core_only(), ["localhost"], durations={"core": 21.3}))
    verdict, next_step = lines[-2:]
    assert "READY" not in verdict
    assert verdict == (  # contract: the verdict line
        "NOT VERIFIED for multi-node PyTorch: core passed (with warnings); network, collectives, ddp did not run "
        "(not selected (--only core))"
    )
    assert says(next_step, "next: ", "same command without --only core", "network, collectives, ddp")
    summary = markdown.render(Report(one_node_core_only(), ["localhost"], durations={"core": 21.3})).splitlines()
    assert summary[0] == "## clustercheck: " + verdict
    assert "stages: core WARN in 21.3 s" in summary[4] and summary[6] == "### Warnings"
    # The next step after the warnings it may refer to, before the table of every check.
    assert summary[summary.index("### Checks") - 2] == "Next: " + next_step.removeprefix("next: ")


def test_the_verdict_and_the_next_step_read_the_skips_data_not_their_messages():
    """A SKIP carries why and the options that left it out as data: rewording every SKIP's message changes neither
    the verdict, the next step, the stages line nor the folded skip lines."""

    results = one_node_core_only()
    reworded = [replace(r, message=f"{r.name} was not run") if r.status is Status.SKIP else r for r in results]
    before, after = (text_lines(Report(rs, ["localhost"], durations={"core": 21.3})) for rs in (results, reworded))
    rows = [line for line in before if not line.startswith(("│", "┏", "┃", "┡", "└"))]
    assert rows == [line for line in after if not line.startswith(("│", "┏", "┃", "┡", "└"))]
    assert says(before[-1], "next: ", "same command without --only core", "network, collectives, ddp")
    document = json_report.document(Report(reworded, ["localhost"], durations={"core": 21.3}))
    stages = {s["name"]: s for s in document["stages"]}
    assert stages["ddp"] == {"name": "ddp", "status": "SKIP", "skipped": "not selected (--only core)"}
    ddp = next(c for c in document["checks"] if c["name"] == "ddp_equivalence")
    assert ddp["stage"] == "ddp" and says(ddp["skip_reason"], "not selected", "--only core")
    assert ddp["deselected_by"] == "--only core"
    assert ddp["message"] == "ddp_equivalence was not run"  # verbatim: the reworded message, passed through


def test_a_ready_cluster_s_next_step_is_the_launch_and_a_failing_one_s_the_first_fix():
    healthy = probe_records("netprobe-healthy.json")
    from clustercheck.checks import collectives, ddp

    peers = [network.Peer(n, r["address"]) for n, r in sorted(healthy.items())]
    results = network.evaluate(healthy, peers, "node1", 29500)
    results += collectives.evaluate_bandwidth(load("collectives-2x2.json"), world_size=4)
    results.append(ddp.evaluate(load("ddp-pass.json"), world_size=3))
    ready = Report(results, sorted(healthy), hosts_args=("--hosts", "inventory/hosts.ini", "--limit", "gpu0*"))
    assert ready.verdict == "READY for multi-node PyTorch"  # contract: the verdict line
    command = "clustercheck launch --hosts inventory/hosts.ini --limit 'gpu0*' -- train.py ARGS"
    assert says(text_lines(ready)[-1], "next: train: ", command, "torchrun on every node")
    failing = text_lines(Report(real_results(), ["node1", "node2", "node3"]))
    assert failing[-2] == "NOT READY: 2 check(s) failed"  # contract: the verdict line
    assert says(failing[-1], "next: fix network.tcp on node1 first", "1 other failure(s)", "same command again")
    fixes = [line for line in failing if line.startswith("fix network.tcp on node")]
    assert len(fixes) == 2 and failing.index(fixes[0]) < failing.index(failing[-2])


def recorded_run(name: str) -> list[CheckResult]:
    """The results of a recorded JSON report (records/), as the run held them: each check's stage from the
    catalog."""
    document = load(name)
    return [
        CheckResult(
            c["name"],
            Status(c["status"]),
            c["message"],
            host=c["host"],
            remediation=c["remediation"],
            data=c["data"],
            stage=registry.get(c["name"]).stage,
        )
        for c in document["checks"]
    ]


def test_one_node_is_ready_for_pytorch_on_that_node_not_for_multi_node():
    """`run --hosts localhost` said "READY for multi-node PyTorch (with warnings)" while its own hostname.resolve
    warned that the name breaks rendezvous across nodes: one node proves what it proves there, with its ranks."""
    results = recorded_run("report-localhost.json")
    one = Report(results, ["localhost"], durations={"core": 2.3, "network": 0.2, "collectives": 3.9, "ddp": 5.6})
    assert one.verdict == (  # contract: the verdict line, quoted in README.md
        "READY for PyTorch on localhost with 2 ranks (with warnings); multi-node not verified with one node"
    )
    assert "READY for multi-node" not in text_lines(one)[-2]
    command = "clustercheck launch --hosts INVENTORY -- train.py ARGS"
    assert says(one.next_step, "read the warnings above", "train: " + command, "torchrun on every node")


def test_the_same_fix_on_several_nodes_is_one_line_naming_them():
    fix = registry.get("time.sync").fix
    results = [
        registry.get("time.sync").result(host, registry.warn("the clock is not synchronized to NTP"))
        for host in ("node1", "node2", "node3")
    ]
    results.append(registry.get("shm.size").result("node2", registry.fail("/dev/shm is 64 MiB")))
    lines = text_lines(Report(results, ["node1", "node2", "node3"]))
    fixes = [line for line in lines if line.startswith("fix ")]
    assert len(fixes) == 2 and says(fixes[0], "fix shm.size", "on node2", registry.get("shm.size").fix)
    assert says(fixes[1], "fix time.sync", "on node1, node2, node3", fix)
    stages = next(line for line in lines if line.startswith("stages:"))
    assert stages.startswith("stages: core FAIL")


def test_the_same_fix_of_several_checks_is_one_line_naming_them():
    """Checks that share their fix (the node-local collectives, say) print it once, not one paragraph per check."""
    fix = "Check the node's shared memory and gloo's interface."
    results = [
        CheckResult(name, Status.FAIL, "did not complete", host="node1", remediation=fix)
        for name in ("local.allreduce", "local.allgather", "local.broadcast")
    ]
    results.append(CheckResult("local.allreduce", Status.FAIL, "did not complete", host="node2", remediation=fix))
    fixes = [line for line in text_lines(Report(results, ["node1", "node2"])) if line.startswith("fix ")]
    assert len(fixes) == 1 and says(
        fixes[0], "fix local.allreduce, local.allgather, local.broadcast", "node1, node2", fix
    )


def test_a_skipped_ddp_stage_is_named_in_the_verdict_with_the_option_that_skipped_it():
    from clustercheck.selection import Selection

    healthy = probe_records("netprobe-healthy.json")
    from clustercheck.checks import collectives

    peers = [network.Peer(n, r["address"]) for n, r in sorted(healthy.items())]
    results = network.evaluate(healthy, peers, "node1", 29500)
    results += collectives.evaluate_bandwidth(load("collectives-2x2.json"), world_size=4)
    why = Selection(skip=("ddp",)).why_not_stage("ddp")
    for check in registry.of_stage("ddp"):
        results += registry.skipped(check, sorted(healthy), why)
    document = Report(results, sorted(healthy))
    assert document.verdict == (  # contract: the verdict line
        "NOT VERIFIED for multi-node PyTorch: network, collectives passed; ddp did not run (not selected (--skip ddp))"
    )
    assert says(document.next_step, "same command without --skip ddp", "verify ddp")


def test_prometheus_takes_its_metrics_from_the_measures_and_knows_no_check_by_name(tmp_path):
    depth = Metric("queue_depth_bytes", "bytes", "A new check's measured value.")
    new = CheckResult("gpu.new", Status.PASS, "m", host="node1", measures=depth.of(4096, host="node1"))
    text = prometheus.render(Report([new], ["node1"]))
    assert promtool(text, tmp_path).returncode == 0
    assert ("clustercheck_queue_depth_bytes", {"host": "node1"}, 4096) in samples(text)
    assert "# HELP clustercheck_queue_depth_bytes A new check's measured value." in text.splitlines()
    source = Path(prometheus.__file__).read_text()
    assert [name for name in registry.REGISTRY if f'"{name}"' in source] == []


def test_the_same_finding_on_several_hosts_is_one_row_naming_them():
    hosts = [f"node{i}" for i in range(1, 6)]
    check = registry.get("time.sync")
    results = [check.result(h, registry.warn("the clock is not synchronized to NTP")) for h in hosts]
    results += [check.result(h, registry.passed("synchronized (chrony)")) for h in hosts[:4]]
    results.append(registry.get("shm.size").result("node2", registry.passed("/dev/shm is 64 GiB")))
    results.append(registry.get("shm.size").result("node3", registry.passed("/dev/shm is 32 GiB")))
    rows = [
        [cell.strip() for cell in line.split("│")[1:-1]]
        for line in text_lines(Report(results, hosts))
        if line.startswith("│") and line.split("│")[1].strip()
    ]
    assert rows == [  # verbatim: each row's message is the one given, passed through; the fold is what is asserted
        ["WARN", "time.sync", "all 5 hosts", "the clock is not synchronized to NTP"],
        ["PASS", "time.sync", "node1, node2, node3 and 1 more", "synchronized (chrony)"],
        ["PASS", "shm.size", "node2", "/dev/shm is 64 GiB"],
        ["PASS", "shm.size", "node3", "/dev/shm is 32 GiB"],
    ]


def test_a_check_passing_in_its_own_words_on_many_hosts_is_one_row_and_its_problems_stay_listed():
    """hostname.resolve says each host's own name and address: a thousand nodes are one row, not a thousand; a
    failure or warning is never folded into it, and a few hosts keep a row each."""
    check = registry.get("hostname.resolve")
    hosts = [f"node{i}" for i in range(1, 13)]
    results = [check.result(h, registry.passed(f"hostname {h} resolves to 10.0.0.{i}")) for i, h in enumerate(hosts)]
    results[5] = check.result("node6", registry.fail("hostname node6 resolves to 127.0.1.1 (loopback)"))
    rows = [(r.status.value, where, r.message) for r, where in text_report.fold(results, hosts)]
    folded = [("PASS", "node1, node2, node3 and 8 more"), ("FAIL", "node6")]
    assert [row[:2] for row in rows] == folded  # contract: the fold, README.md's "the first three and how many more"
    assert says(rows[0][2], "node1: hostname node1 resolves to 10.0.0.0", "each host's own message", "JSON report")
    assert says(rows[1][2], "node6: hostname node6 resolves to 127.0.1.1 (loopback)")
    assert sum(line.startswith("│") and "hostname.resolve" in line for line in text_lines(Report(results, hosts))) == 2
    few = [r for r in results if r.host in hosts[:4]]
    assert sum(line.startswith("│") and "hostname.resolve" in line for line in text_lines(Report(few, hosts[:4]))) == 4


def test_each_gpu_s_figures_are_gauges_per_host_gpu_and_bus_id_that_promtool_accepts(tmp_path):
    """The gpu.perf.* checks judged on the recorded H200 node, its GPU's figures constructed in gpubench's shape."""
    from clustercheck.checks import gpuperf
    from clustercheck.facts import collect
    from clustercheck.facts.model import GpuBench
    from clustercheck.inventory import Node

    raw = load("facts-h200-vm.json")
    results = []
    for host in ("gpu01", "gpu02"):
        facts = collect.build(Node(name=host, address=host), raw, python="python3", python_source="x")
        entry = {"index": 0, "bus_id": facts.smi.gpus[0].bus_id, "name": "NVIDIA H200", "memory_gbps": 7800.0}
        entry.update({"matmul_tflops": {"bf16": 760.0, "tf32": 420.0, "fp32": 55.5}, "h2d_gbps": 52, "d2h_gbps": 50})
        facts = replace(
            facts, gpu_bench=GpuBench.from_answer({"cuda": True, "copy_counts": "read+written", "gpus": [entry]})
        )
        results += [r for r in registry.run_node_checks(facts) if r.name in gpuperf.CHECKS]
    text = prometheus.render(Report(results, ["gpu01", "gpu02"], "x", 1, 2))
    proc = promtool(text, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = samples(text)
    bus = "00000000:00:06.0"
    assert (
        "clustercheck_gpu_matmul_flops",
        {"host": "gpu02", "gpu": "0", "bus_id": bus, "dtype": "tf32"},
        420e12,
    ) in got
    memory = {"host": "gpu01", "gpu": "0", "bus_id": bus}
    assert ("clustercheck_gpu_memory_copy_bytes_per_second", memory, 7800e9) in got
    d2h = {**memory, "direction": "device_to_host"}
    assert ("clustercheck_gpu_host_copy_bytes_per_second", d2h, 50e9) in got
    names = {n for n, _, _ in got if n.startswith("clustercheck_gpu_")}
    assert len(names) == 3 and all(f"`{n}`" in MONITORING_DOC.read_text() for n in names)
