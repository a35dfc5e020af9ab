"""The text report's table, on results judged from records of real runs (tests/unit/records: network probes of
the Docker test cluster with a firewalled node, a 2x2 gloo collectives job, a 3-rank DDP job) and on the recorded
facts of a Debian 12 machine (facts-debian12-localhost.json)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from harness import real_results
from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from wording import says

from clustercheck.checks import registry
from clustercheck.facts import collect
from clustercheck.inventory import Node
from clustercheck.model import CheckResult, Status
from clustercheck.report import CLUSTER_SUITE, text

RECORDS = Path(__file__).parent / "records"


def judged() -> list[CheckResult]:
    """What the text table shows: the results that are not skipped, a three-node run's and one node's checks."""
    raw = json.loads((RECORDS / "facts-debian12-localhost.json").read_text())
    facts = collect.build(Node(name="localhost", address="localhost"), raw, python="python3", python_source="x")
    results = real_results() + registry.run_node_checks(facts)
    return [r for r in results if r.status is not Status.SKIP]


def rendered(results: list[CheckResult], width: int) -> list[str]:
    buffer = io.StringIO()
    text.print_table(results, Console(file=buffer, width=width, color_system=None))
    return buffer.getvalue().splitlines()


def rich_table(results: list[CheckResult], width: int) -> list[str]:
    """The same rows through rich's Table, as the report drew them before its own layout."""
    table = Table()
    for column in text.COLUMNS:
        table.add_column(column, overflow="fold")
    for r in results:
        message = r.message.removeprefix(f"{r.host}: ") if r.host else r.message
        table.add_row(r.status.value, r.name, r.host or CLUSTER_SUITE, message)
    buffer = io.StringIO()
    Console(file=buffer, width=width, color_system=None).print(table)
    return buffer.getvalue().splitlines()


@pytest.mark.parametrize("width", [40, 80, 200])
def test_the_table_is_drawn_as_rich_draws_it_at_every_width(width):
    results = judged()
    assert len(results) > 20
    assert rendered(results, width) == rich_table(results, width)


def test_long_words_fold_and_wide_characters_keep_the_columns_in_line():
    results = [
        registry.get("torch.import").result("node1", registry.fail("No module named " + "x" * 150 + " found")),
        registry.get("time.sync").result("node2", registry.warn("時刻が同期されていません、" * 8)),
        registry.get("nodes.distinct").result(None, registry.passed("")),
    ]
    lines = rendered(results, 80)
    assert lines == rich_table(results, 80)
    assert {cell_len(line) for line in lines} == {80}  # every line as wide as the console, borders in line
    message = "".join(line.split("│")[4].strip() for line in lines if line.startswith("│") and "x" in line)
    assert "x" * 150 in message  # folded, nothing lost


def test_the_status_is_coloured_in_a_terminal():
    results = [registry.get("shm.size").result("node2", registry.fail("/dev/shm is 64 MiB"))]
    buffer = io.StringIO()
    text.print_table(results, Console(file=buffer, width=80, color_system="standard", force_terminal=True))
    row = next(line for line in buffer.getvalue().splitlines() if "shm.size" in line)
    assert "\x1b[1;31mFAIL\x1b[0m" in row  # bold red, as text.STYLES has it


def test_node_health_lines_fold_the_skips_by_reason_as_run_does():
    """node-health's text: a line per check that judged something, and the SKIPs in one line per reason (33 SKIP
    lines one by one buried the three that mattered)."""
    from clustercheck.checks import registry
    from clustercheck.model import Status
    from clustercheck.report import text

    host = "gpunode1"
    results = [registry.emit("firewall", Status.WARN, f"{host}: no input filter", host=host)]
    results += [
        registry.get(name).result(host, registry.skip("no NVIDIA GPU on this node (none expected)"))
        for name in ("gpu.count", "gpu.ecc", "gpu.xid", "pcie.link")
    ]
    lines = text.result_lines(results, [host])
    assert lines[0].startswith("WARN  firewall")
    (folded,) = lines[1:]
    assert says(folded, "SKIP", "4 skipped", "no NVIDIA GPU on this node (none expected)", "(gpu.*, pcie.link)")
