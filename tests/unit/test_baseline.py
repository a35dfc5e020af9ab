"""A run against an earlier report (`run --baseline`) and `clustercheck diff`, on reports of real runs: the JSON
report of `clustercheck run --hosts localhost` on the development machine, and the network checks' reports of the
recorded probes of the 3-node test cluster, healthy and with node2's egress rate-limited (records/README.md)."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner
from harness import probe_records
from wording import says

from clustercheck import expected, report
from clustercheck.checks import baseline, gpuperf, network, registry
from clustercheck.commands import cli
from clustercheck.facts.model import GpuBench
from clustercheck.model import Status
from clustercheck.report import Report
from clustercheck.report import diff as diffs
from clustercheck.report import json as json_report
from clustercheck.report.load import ReportError, load

RECORDS = Path(__file__).parent / "records"


def local_report() -> dict:
    return json.loads((RECORDS / "report-localhost.json").read_text())


def network_report(record: str) -> dict:
    """The JSON report of the network checks judged on a recorded probe of the 3-node test cluster."""
    records = probe_records(record)
    peers = [network.Peer(name, r["address"]) for name, r in sorted(records.items())]
    results = network.evaluate(records, peers, master="node1", master_port=29500)
    return json_report.document(Report(results, sorted(records)))


def given(document: dict, **tolerances: str) -> baseline.Baseline:
    texts = [f"{figure}={bounds}" for figure, bounds in tolerances.items()]
    return baseline.Baseline(document, "baseline.json", baseline.parse_tolerances(texts))


def by_name(results) -> dict:
    return {(r.name, r.host): r for r in results}


def test_a_link_slowed_on_one_node_is_named_with_then_and_now():
    results = by_name(
        baseline.evaluate(given(network_report("netprobe-healthy.json")), network_report("netprobe-node2-tbf.json"))
    )
    throughput = results[("baseline.throughput", None)]
    assert throughput.status is Status.FAIL
    assert "node2 -> node1 throughput 50 Mbit/s, baseline 2.1 Gbit/s (-98 %)" in throughput.message
    assert "node2 -> node3 throughput 49 Mbit/s, baseline 2.2 Gbit/s (-98 %)" in throughput.message
    assert "node1 -> node3" not in throughput.message  # within its tolerance: judged, not named
    failed = {c["key"] for c in throughput.data["changes"] if c["status"] == "FAIL"}
    assert failed == {"node2 -> node1", "node2 -> node3"}
    rtt = results[("baseline.rtt", None)]
    assert rtt.status is Status.FAIL and rtt.message.startswith("node1 <-> node2 round trip 1.93 ms, baseline 0.01 ms")
    assert throughput.remediation == registry.get("baseline.throughput").fix


def test_the_same_report_is_within_every_tolerance():
    document = local_report()
    results = by_name(baseline.evaluate(given(document), document))
    assert results[("baseline.busbw", None)].status is Status.PASS
    assert results[("baseline.ddp_step", None)].message.endswith("(+0 %): within its tolerance")
    assert results[("baseline.collector", "localhost")].status is Status.PASS
    assert results[("baseline.versions", None)].status is Status.PASS
    assert (
        "the same cuda, driver, gpu_count, mtu, nccl, python, torch, vbios"
        in results[("baseline.versions", None)].message
    )
    assert results[("baseline.rtt", None)].status is Status.SKIP  # one node: no pair measured, now or then


def test_a_figure_worse_than_its_tolerance_warns_then_fails_and_the_tolerance_is_the_users():
    then = local_report()
    now = copy.deepcopy(then)
    ddp = next(c for c in now["checks"] if c["name"] == "ddp_equivalence")
    ddp["data"]["ddp_samples_per_s"] /= 1.3  # each step takes 30 % longer
    (step,) = [r for r in baseline.evaluate(given(then), now) if r.name == "baseline.ddp_step"]
    assert step.status is Status.WARN and "(+30 %) (WARN past 20 %, FAIL past 50 %)" in step.message
    (step,) = [r for r in baseline.evaluate(given(then, ddp_step="10:25"), now) if r.name == "baseline.ddp_step"]
    assert step.status is Status.FAIL
    (step,) = [r for r in baseline.evaluate(given(then, ddp_step="40"), now) if r.name == "baseline.ddp_step"]
    assert step.status is Status.PASS


def test_busbw_is_compared_per_size_from_one_mebibyte():
    then = local_report()
    now = copy.deepcopy(then)
    sweep = next(c for c in now["checks"] if c["name"] == "allreduce.bandwidth")["data"]["sizes"]
    for row in sweep:
        row["busbw_gbps"] /= 2
    (busbw,) = [r for r in baseline.evaluate(given(then), now) if r.name == "baseline.busbw"]
    assert busbw.status is Status.FAIL
    judged = {c["key"]: c["status"] for c in busbw.data["changes"]}
    assert judged["cluster all_reduce busbw at 4 MiB"] == "FAIL"
    assert sorted(judged) == [f"cluster all_reduce busbw at {n} MiB" for n in (1, 2, 4)]  # not below 1 MiB
    assert "cluster all_reduce busbw at 4 MiB" in busbw.message and "-50 %" in busbw.message


def test_a_node_or_pair_missing_from_the_baseline_is_said_not_failed():
    then = network_report("netprobe-healthy.json")
    throughput = next(c for c in then["checks"] if c["name"] == "network.throughput")
    throughput["data"]["flows"] = [f for f in throughput["data"]["flows"] if "node3" not in (f["from"], f["to"])]
    then["hosts"] = ["node1", "node2"]
    now = network_report("netprobe-healthy.json")
    results = by_name(baseline.evaluate(given(then), now))
    assert results[("baseline.throughput", None)].status is Status.PASS
    assert (
        "not in the baseline: node1 -> node3, node2 -> node3, node3 -> node1"
        in results[("baseline.throughput", None)].message
    )
    assert results[("baseline.versions", None)].data["hosts_added"] == ["node3"]
    gone = by_name(baseline.evaluate(given(now), then))[("baseline.throughput", None)]
    assert gone.status is Status.PASS and "in the baseline, not measured now: node1 -> node3" in gone.message


def test_a_version_that_changed_on_one_node_is_named():
    then = local_report()
    now = copy.deepcopy(then)
    next(c for c in now["checks"] if c["name"] == "consistency.torch")["data"]["values"]["localhost"] = "2.14.0+cpu"
    (versions,) = [r for r in baseline.evaluate(given(then), now) if r.name == "baseline.versions"]
    assert versions.status is Status.WARN
    assert says(versions.message, "localhost", "torch 2.14.0+cpu", "baseline 2.13.0+cpu")


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("speed=10", "FIGURE one of busbw, rtt, throughput, fabric, ddp_step, collector"),
        ("busbw", "give FIGURE=WARN[:FAIL]"),
        ("busbw=ten", "WARN and FAIL are numbers"),
        ("busbw=30:10", "0 <= WARN <= FAIL"),
    ],
)
def test_a_tolerance_that_cannot_be_read_is_one_line(text, error):
    with pytest.raises(baseline.ToleranceError, match=re.escape(error)):
        baseline.parse_tolerances([text])


def test_a_tolerance_without_a_fail_bound_never_fails():
    assert baseline.parse_tolerances(["rtt=5"])["rtt"] == baseline.Tolerance(5, None)
    assert baseline.parse_tolerances([])["busbw"] == baseline.Tolerance(10, 25)


def test_the_reports_of_real_runs_and_the_baseline_checks_match_the_schema():
    validator = jsonschema.Draft202012Validator(json.loads(report.schema_text()))
    document = local_report()
    validator.validate(document)
    results = baseline.evaluate(given(document), document)
    validator.validate(json_report.document(Report(results, ["localhost"], durations={"baseline": 0.1})))
    validator.validate(network_report("netprobe-node2-tbf.json"))


def write(tmp_path: Path, name: str, document) -> str:
    path = tmp_path / name
    path.write_text(document if isinstance(document, str) else json.dumps(document))
    return str(path)


@pytest.mark.parametrize(
    ("content", "error"),
    [
        (None, "cannot read it (No such file or directory)"),
        ("not json", "not JSON (Expecting value: line 1 column 1"),
        ('{"schema_version": 2}', "schema_version 2, this clustercheck reads schema_version 1"),
        ('{"schema_version": 1, "status": "PASS", "hosts": []}', "at the top level: 'checks' is a required property"),
        ("[1]", "a JSON list, not an object"),
    ],
)
def test_a_file_that_is_not_a_report_is_refused_in_one_line(tmp_path, content, error):
    path = tmp_path / "r.json" if content is None else write(tmp_path, "r.json", content)
    with pytest.raises(ReportError) as caught:
        load(path)
    assert error in str(caught.value) and "\n" not in str(caught.value)
    assert str(caught.value).startswith(str(path))
    Path(path).unlink(missing_ok=True)  # not a report: the schema fixture must not read it


def test_diff_names_nodes_versions_statuses_and_figures_and_fails_on_a_regression(tmp_path):
    then = network_report("netprobe-healthy.json")
    then["hosts"].append("node4")
    old = write(tmp_path, "old.json", then)
    new = write(tmp_path, "new.json", network_report("netprobe-node2-tbf.json"))
    runner = CliRunner()
    text = runner.invoke(cli, ["diff", old, new])
    assert text.exit_code == 1, text.output
    assert "node4 gone" in text.output
    assert "network.throughput (cluster): PASS -> WARN" in text.output
    assert "FAIL node2 -> node1 throughput 50 Mbit/s, baseline 2.1 Gbit/s (-98 %)" in text.output
    data = json.loads(runner.invoke(cli, ["diff", old, new, "--format", "json"]).output)
    assert data["diff_version"] == 1 and data["regressed"] is True and data["hosts_gone"] == ["node4"]
    assert {(f["figure"], f["key"], f["status"]) for f in data["figures"]} >= {("throughput", "node2 -> node1", "FAIL")}
    markdown = runner.invoke(cli, ["diff", old, new, "--format", "markdown"]).output
    assert markdown.startswith("### clustercheck diff") and "- `node4` gone" in markdown
    lenient = runner.invoke(cli, ["diff", old, new, "--tolerance", "throughput=99", "--tolerance", "rtt=100000"])
    assert lenient.exit_code == 0, lenient.output
    same = runner.invoke(cli, ["diff", new, new])
    assert same.exit_code == 0 and "0 of" in same.output.splitlines()[0]


def test_the_changes_of_two_reports_are_one_computation():
    then, now = network_report("netprobe-healthy.json"), network_report("netprobe-node2-tbf.json")
    changes = diffs.diff(then, now)
    run = by_name(baseline.evaluate(given(then), now))[("baseline.throughput", None)]
    assert {c.key for c in changes.figures if c.figure == "throughput"} == {
        c["key"] for c in run.data["changes"] if c["status"] != "PASS"
    }


def test_the_schema_knows_every_figure():
    schema = json.loads(report.schema_text())
    figure = schema["$defs"]["baseline"]["properties"]["changes"]["items"]["properties"]["figure"]
    assert figure["enum"] == list(baseline.FIGURES)
    assert schema["$defs"]["stage"]["properties"]["name"]["enum"][-1] == baseline.STAGE


def test_the_documented_defaults_are_the_tolerances():
    options = (Path(__file__).resolve().parents[2] / "docs" / "run.md").read_text()
    row = next(
        line for line in options.splitlines() if line.startswith("| `--baseline-tolerance FIGURE=WARN[:FAIL]` |")
    )
    defaults = ", ".join(f"`{name}={bounds.text}`" for name, bounds in baseline.DEFAULT_TOLERANCES.items())
    assert f"| {defaults} |" in row
    help_text = " ".join(CliRunner().invoke(cli, ["run", "--help"], terminal_width=400).output.split())
    assert (
        "FIGURE (default) is busbw (10:25), rtt (50:200), throughput (20:50), fabric (20:50), ddp_step (20:50), "
        "collector (50:200)" in help_text
    )


def another_clusters_report() -> dict:
    """The recorded localhost report as another cluster's: its node renamed gpu01 (every host field and key that
    names it), its torch another version (both edits made here)."""
    other = json.loads(json.dumps(local_report()).replace('"localhost"', '"gpu01"'))
    next(c for c in other["checks"] if c["name"] == "consistency.torch")["data"]["values"]["gpu01"] = "2.12.0+cu126"
    return other


def test_a_baseline_of_other_nodes_fails_naming_both_and_compares_nothing():
    compared = baseline.evaluate(given(another_clusters_report()), local_report())
    schema = jsonschema.Draft202012Validator(json.loads(report.schema_text()))
    schema.validate(json_report.document(Report(compared, ["localhost"], durations={"baseline": 0.1})))
    results = by_name(compared)
    versions = results[("baseline.versions", None)]
    assert versions.status is Status.FAIL
    assert versions.message.startswith(
        "no node in common with the baseline: baseline.json of 2026-11-24T13:53:45Z checked gpu01; this run "
        "checked localhost. Nothing was compared"
    )
    assert versions.data["nodes"] == {"baseline": ["gpu01"], "now": ["localhost"], "common": []}
    assert versions.remediation.startswith("Give --baseline a JSON report of these nodes, under the names this run")
    for name in ("baseline.busbw", "baseline.rtt", "baseline.throughput", "baseline.ddp_step"):
        assert results[(name, None)].status is Status.SKIP, name
        assert says(results[(name, None)].message, "not compared", "no node in common")
    assert results[("baseline.collector", "localhost")].status is Status.SKIP
    assert not [r for r in results.values() if r.data.get("changes")]  # not one figure compared


def test_a_baseline_of_other_nodes_as_well_compares_the_nodes_in_both_and_not_the_cluster_wide_figures():
    """The recorded report as the baseline of a two-node cluster (its hosts list given a second node here): the
    node's own figures are compared, the cluster's all_reduce busbw and DDP step, measured across other nodes, are
    not, and say across which."""
    then = local_report()
    then["hosts"] = ["localhost", "node2"]
    results = by_name(baseline.evaluate(given(then), local_report()))
    busbw = results[("baseline.busbw", None)]
    assert busbw.status is Status.SKIP and not busbw.data["changes"]
    assert busbw.data["not_compared"] == [f"cluster all_reduce busbw at {n} MiB" for n in (1, 2, 4)]
    assert busbw.message.startswith(
        "not compared, measured across other nodes (the baseline's across localhost, node2, this "
        "run's across localhost): cluster all_reduce busbw at 1 MiB"
    )
    ddp = results[("baseline.ddp_step", None)]
    assert ddp.status is Status.SKIP and ddp.message.endswith("this run's across localhost): DDP step")
    schema = jsonschema.Draft202012Validator(json.loads(report.schema_text()))
    schema.validate(json_report.document(Report(list(results.values()), ["localhost"])))
    assert results[("baseline.collector", "localhost")].data["changes"]  # the node's own figure is compared
    versions = results[("baseline.versions", None)]
    assert versions.status is Status.PASS
    assert "compared on the node(s) in both: localhost; in the baseline, not checked now: node2" in versions.message
    assert by_name(baseline.evaluate(given(local_report()), local_report()))[("baseline.busbw", None)].data[
        "changes"
    ]  # the same nodes: compared


def test_diff_of_reports_with_no_node_in_common_says_so_and_fails(tmp_path):
    other = write(tmp_path, "other.json", another_clusters_report())
    mine = write(tmp_path, "mine.json", local_report())
    runner = CliRunner()
    text = runner.invoke(cli, ["diff", mine, other])
    assert text.exit_code == 1, text.output
    first, *rest = text.output.splitlines()
    assert "no node in common: OLD checked localhost, NEW checked gpu01; nothing compared" in first
    assert says("\n".join(rest), "nodes: 2", "gpu01 added", "localhost gone")
    not_compared = [line.split()[0] for line in rest if line.endswith(": not compared")]
    assert not_compared == ["versions:", "statuses:", "figures"]  # every section says so, none left out
    data = json.loads(runner.invoke(cli, ["diff", mine, other, "--format", "json"]).output)
    assert data["hosts_common"] == [] and data["versions"] == [] and data["regressed"] is False
    markdown = runner.invoke(cli, ["diff", mine, other, "--format", "markdown"]).output
    assert "**versions**: not compared" in markdown


def test_diff_of_reports_with_some_nodes_in_common_names_them_and_leaves_the_cluster_wide_figures_out(tmp_path):
    then = local_report()
    then["hosts"] = ["localhost", "node2"]  # as a baseline of two nodes (edited here)
    now = local_report()
    sweep = next(c for c in now["checks"] if c["name"] == "allreduce.bandwidth")["data"]["sizes"]
    for row in sweep:
        row["busbw_gbps"] /= 2  # across one node instead of two: not a regression of the same measurement
    old, new = write(tmp_path, "old.json", then), write(tmp_path, "new.json", now)
    proc = CliRunner().invoke(cli, ["diff", old, new])
    assert proc.exit_code == 0, proc.output
    assert "; compared on the node(s) in both: localhost" in proc.output.splitlines()[0]
    assert "  node2 gone" in proc.output
    assert "cluster all_reduce busbw at 4 MiB" not in proc.output.split("cluster-wide figures not compared")[0]
    assert (
        "cluster-wide figures not compared, measured across other nodes (the baseline's across localhost, node2, "
        "this run's across localhost): 4" in proc.output
    )


# ------------------------------------------------------------------------------------------- each GPU's figures

H100 = "NVIDIA H100 80GB HBM3"


def gpu(index: int, bus: int, bf16: float = 700.0, h2d: float = 55.0) -> dict:
    """One GPU's entry as the node-side gpubench prints it (remote/gpubench.py)."""
    return {
        "index": index,
        "bus_id": f"00000000:{bus:02X}:00.0",
        "name": H100,
        "matmul_tflops": {"bf16": bf16, "tf32": 380.0, "fp32": 50.0},
        "memory_gbps": 2900.0,
        "h2d_gbps": h2d,
        "d2h_gbps": 54.0,
    }


def gpu_report(nodes: dict[str, list[dict]]) -> dict:
    """The JSON report of the gpu.perf.* checks judged on each node's gpubench answer (NODES: host -> GPU entries)."""
    match = expected.shipped().match([H100])
    results = []
    for host, gpus in nodes.items():
        bench = GpuBench.from_answer({"cuda": True, "copy_counts": "read+written", "gpus": gpus})
        for name, figures in gpuperf.CHECKS.items():
            results.append(registry.result(name, host, gpuperf.judge_node(bench, match, figures, host)))
    return json_report.document(Report(results, list(nodes)))


HEALTHY = {"node1": [gpu(0, 0x18), gpu(1, 0x19)], "node2": [gpu(0, 0x18), gpu(1, 0x19)]}


def test_a_gpu_slower_than_its_baseline_is_named_with_its_node_bus_id_figure_then_and_now():
    slower = copy.deepcopy(HEALTHY)
    slower["node2"][1] = gpu(1, 0x19, bf16=490.0, h2d=50.0)  # -30 %, and -9 %: within the tolerance
    results = by_name(baseline.evaluate(given(gpu_report(HEALTHY)), gpu_report(slower)))
    node2 = results[("baseline.gpu_perf", "node2")]
    assert node2.status is Status.FAIL
    assert says(node2.message, "node2 GPU 00000000:19:00.0 bf16 multiply", "490 TFLOP/s", "baseline 700", "-30 %")
    assert says(node2.message, "WARN past 10 %", "FAIL past 25 %")
    assert node2.remediation == registry.get("baseline.gpu_perf").fix
    assert {c["key"] for c in node2.data["changes"]} >= {"node2 GPU 00000000:19:00.0 host-to-device copy"}
    assert len(node2.data["changes"]) == 12  # two GPUs, six figures each
    node1 = results[("baseline.gpu_perf", "node1")]
    assert node1.status is Status.PASS and node1.message.startswith("12 figure(s) within their tolerance")
    warned = by_name(baseline.evaluate(given(gpu_report(HEALTHY), gpu_perf="20:50"), gpu_report(slower)))
    assert warned[("baseline.gpu_perf", "node2")].status is Status.WARN
    lenient = by_name(baseline.evaluate(given(gpu_report(HEALTHY), gpu_perf="40"), gpu_report(slower)))
    assert lenient[("baseline.gpu_perf", "node2")].status is Status.PASS


def test_a_gpu_is_matched_with_its_baseline_by_bus_id_whatever_torch_s_index():
    renumbered = {"node1": [gpu(0, 0x19), gpu(1, 0x18, bf16=600.0)], "node2": HEALTHY["node2"]}
    results = by_name(baseline.evaluate(given(gpu_report(HEALTHY)), gpu_report(renumbered)))
    node1 = results[("baseline.gpu_perf", "node1")]
    assert node1.status is Status.WARN  # -14 %: the GPU at 18:00.0, torch's 0 then and 1 now
    assert node1.message.startswith("node1 GPU 00000000:18:00.0 bf16 multiply 600 TFLOP/s, baseline 700 TFLOP/s")
    assert not node1.data["not_in_baseline"] and not node1.data["not_measured_now"]


def test_a_gpu_only_one_report_measured_is_said_and_a_node_without_figures_skips():
    gone = {"node1": [gpu(0, 0x18)], "node2": []}
    then = gpu_report(HEALTHY)
    results = by_name(baseline.evaluate(given(then), gpu_report(gone)))
    node1 = results[("baseline.gpu_perf", "node1")]
    assert node1.status is Status.PASS
    assert "in the baseline, not measured now: node1 GPU 00000000:19:00.0 bf16 multiply" in node1.message
    node2 = results[("baseline.gpu_perf", "node2")]
    assert node2.status is Status.SKIP and says(node2.message, "node2: ", "no GPU", "measured now")
    # the recorded localhost report has no GPU: a baseline of it has no such figure
    local = by_name(baseline.evaluate(given(local_report()), local_report()))
    assert local[("baseline.gpu_perf", "localhost")].status is Status.SKIP


def test_the_gpu_comparison_matches_the_schema_and_diff_lists_it(tmp_path):
    validator = jsonschema.Draft202012Validator(json.loads(report.schema_text()))
    slower = copy.deepcopy(HEALTHY)
    slower["node1"][0] = gpu(0, 0x18, bf16=350.0)
    then, now = gpu_report(HEALTHY), gpu_report(slower)
    validator.validate(now)
    results = baseline.evaluate(given(then), now)
    validator.validate(json_report.document(Report(results, ["node1", "node2"], durations={"baseline": 0.1})))
    out = CliRunner().invoke(cli, ["diff", write(tmp_path, "old.json", then), write(tmp_path, "new.json", now)])
    assert out.exit_code == 1, out.output
    assert "FAIL node1 GPU 00000000:18:00.0 bf16 multiply 350 TFLOP/s, baseline 700 TFLOP/s (-50 %)" in out.output
