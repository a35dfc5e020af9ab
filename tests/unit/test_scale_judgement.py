"""What keeps the controller's judgement of a torch job linear in its ranks and its memory per node small: each
node's records read from an index made once, a node's records parsed as one document (their keys held once), the
collector's raw command outputs and the whole kernel log not kept past the node's own checks, the JSON report
written as it is rendered. The figures: docs/benchmarks.md, "The whole run's controller side at 4,000 nodes"."""

from __future__ import annotations

import io
import json
import xml.etree.ElementTree as ET
from pathlib import Path

from clustercheck import report
from clustercheck.facts import collect
from clustercheck.inventory import Node
from clustercheck.model import CheckResult, Status
from clustercheck.report import delivery, junit
from clustercheck.report import json as json_report
from clustercheck.stages import launch, torchjob
from clustercheck.stages.core import settled

RECORDS_DIR = Path(__file__).parent / "records"
DATA = Path(__file__).parent / "data"  # provenance of both: their README.md
# Four gloo ranks on two torchrun agents, recorded (provenance: tests/unit/records/README.md).
RECORDS = json.loads((RECORDS_DIR / "collectives-2x2.json").read_text())


def _job(nodes: int, per_node: int) -> torchjob.JobOutcome:
    """A job's outcome of NODES nodes of PER_NODE ranks each, from the recorded rank records."""
    records, ranks = [], {}
    for n in range(nodes):
        name = f"node{n}"
        ranks[name] = list(range(n * per_node, (n + 1) * per_node))
        for local, rank in enumerate(ranks[name]):
            records.append({**RECORDS[local % len(RECORDS)], "rank": rank, "local_rank": local, "node": name})
    return torchjob.JobOutcome(records, nodes * per_node, "gloo", ranks=ranks)


def test_each_nodes_records_come_from_the_index_in_their_order_and_an_unknown_node_has_none():
    job = _job(5, 3)
    assert [r["rank"] for r in job.of_node("node3")] == [9, 10, 11]
    assert job.of_node("node9") == []


def test_a_nodes_records_share_their_keys_and_a_line_that_is_not_json_is_still_left_out():
    lines = [json.dumps({**RECORDS[0], "rank": r}) for r in range(3)]
    whole, _ = launch.parse_collected("\n".join(lines) + "\n" + launch.LOGS_LINE + "\n")
    assert [r["rank"] for r in whole] == [0, 1, 2]
    first, second = (next(k for k in r if k == "bandwidth") for r in whole[:2])
    assert first is second  # one key object for the node's records, not one per record
    cut, _ = launch.parse_collected("\n".join([lines[0], lines[1][:40], lines[2]]) + "\n")
    assert [r["rank"] for r in cut] == [0, 2]


def test_the_raw_command_outputs_and_the_kernel_log_are_not_kept_past_the_nodes_checks_and_the_rest_is():
    """The whole kernel log was kept to the end of the run for one cluster check (about 0.5 GiB at 4,000 nodes):
    only its neighbour-table overflow lines are, as a fact of their own."""
    log = (DATA / "kernel-log-neighbour-overflow-netdev-2019.txt").read_text()
    raw = json.loads((RECORDS_DIR / "facts-debian12-localhost.json").read_text())
    raw["commands"]["kernel_log"] = {"rc": 0, "out": log, "err": ""}
    facts = collect.build(Node(name="node1", address="node1"), raw, python="python3", python_source="PATH")
    assert facts.kernel_log == log  # the node's own checks and evidence read it whole
    kept = settled(facts)
    assert "commands" not in kept.raw and kept.kernel_log is None
    assert len(kept.neighbour_overflows) == 1 and "arp_cache: neighbor table overflow" in kept.neighbour_overflows[0]
    assert kept.raw["torch"] == raw["torch"] and kept.raw["mtu"] == raw["mtu"] and kept.torch == facts.torch


class Pieces(io.StringIO):
    """A file that keeps the size of every write: a report written in pieces, not as one string."""

    def __init__(self) -> None:
        super().__init__()
        self.sizes: list[int] = []

    def write(self, text: str) -> int:
        self.sizes.append(len(text))
        return super().write(text)


def test_the_json_report_is_written_as_it_is_rendered_never_held_as_one_string(tmp_path, monkeypatch):
    """The run directory's report.json, and -o FILE or stdout in JSON, hold the same text as before; the text is
    never one string (95 MB at 4,000 nodes) but written in the encoder's pieces, and the saved file is copied, not
    rendered again."""
    hosts = [f"node{n}" for n in range(200)]
    results = [
        CheckResult("gpu.count", Status.FAIL if n == 7 else Status.PASS, "8 GPUs", host, data={"gpus": list(range(8))})
        for n, host in enumerate(hosts)
    ]
    document = report.Report(results, hosts, "run1", 0.0, 1.0, durations={"core": 1.0})
    whole = report.render(document, "json")
    pieces = Pieces()
    json_report.write(document, pieces)
    assert pieces.getvalue() == whole + "\n" and max(pieces.sizes) < len(whole) / 100

    def whole_string(_):
        raise AssertionError("the JSON report rendered as one string")

    monkeypatch.setattr(json_report, "render", whole_string)
    saved = delivery.save(document, tmp_path / "run")
    assert saved["json"].read_text() == whole + "\n"
    assert ET.parse(saved["junit"]).getroot().tag == "testsuites"
    delivery.deliver(document, "json", str(tmp_path / "out.json"), print, saved)
    assert (tmp_path / "out.json").read_text() == whole + "\n"
    echoed: list[str] = []
    delivery.deliver(document, "json", None, echoed.append, saved)
    assert echoed == [whole]


def test_the_junit_report_is_written_suite_by_suite_indented_as_the_whole_tree(tmp_path):
    """report.xml is written one suite at a time (43 MB and its whole element tree at 4,000 nodes), and reads as
    the tree indented whole would: a suite per host and one for the cluster, every case, the totals."""
    hosts = ["node1", "node2", "node3"]
    results = [CheckResult("gpu.count", Status.FAIL, "2 of 8 GPUs", "node2", remediation="reseat & reboot")]
    results += [CheckResult("gpu.count", Status.PASS, "8 GPUs", h) for h in ("node1", "node3")]
    results += [CheckResult("clock.skew", Status.SKIP, "one node", None), CheckResult("ntp", Status.ERROR, "<x>", None)]
    document = report.Report(results, hosts)
    pieces = Pieces()
    junit.write(document, pieces)
    text = pieces.getvalue()
    assert max(pieces.sizes) < len(text) / 2  # no one piece is the whole report
    head, _, body = text.partition("\n")
    assert head == '<?xml version="1.0" encoding="utf-8"?>'
    tree = ET.fromstring(body)
    ET.indent(tree)
    assert body == ET.tostring(tree, encoding="unicode") + "\n"
    assert [s.get("name") for s in tree] == [*hosts, "(cluster)"]
    assert (tree.get("tests"), tree.get("failures"), tree.get("errors"), tree.get("skipped")) == ("5", "1", "1", "1")
    failure = tree[1][0].find("failure")
    assert "2 of 8 GPUs" in failure.get("message") and "fix: reseat & reboot" in failure.text
    assert delivery.save(document, tmp_path, kinds=("junit",))["junit"].read_text() == text
    assert report.render(document, "junit") + "\n" == text
