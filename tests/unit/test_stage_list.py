"""One stage list (clustercheck/selection.py): the pipeline's modules, the command line and the catalog follow it."""

from __future__ import annotations

from click.testing import CliRunner

from clustercheck import catalog, checks, stages
from clustercheck.commands import cli
from clustercheck.selection import DECLARED, DISTRIBUTED, STAGES


def test_every_multinode_stage_is_a_module_named_as_its_stage():
    modules = stages.modules()
    assert list(modules) == list(DISTRIBUTED) == [s.name for s in DECLARED[1:] if s.asked_by is None]
    assert [s.name for s in DECLARED if s.asked_by] == ["baseline"]  # compared by the pipeline, not a module
    assert all(name == module.NAME for name, module in modules.items())


def test_every_check_belongs_to_a_declared_stage_and_every_stage_has_checks():
    assert {c.stage for c in checks.REGISTRY.values()} == set(STAGES)


def test_the_command_line_offers_the_declared_stages():
    text = CliRunner().invoke(cli, ["run", "--help"], terminal_width=400).output
    assert f"Skip a stage ({', '.join(DISTRIBUTED)})" in " ".join(text.split())
    assert "[" + "|".join(STAGES) + "]" in text


def test_the_stage_table_has_one_row_per_stage_with_its_checks():
    rows = catalog.stage_table().splitlines()[2:]
    assert [row.split("|")[1].strip(" `") for row in rows] == [s.name for s in DECLARED]
    network = next(row for row in rows if row.startswith("| `network`"))
    assert "`network.*`" in network
    ddp = next(row for row in rows if row.startswith("| `ddp`"))
    assert "`ddp_equivalence`, `checkpoint`" in ddp


def test_a_family_of_three_or_more_checks_is_one_glob():
    assert catalog.families(["a", "gpu.x", "gpu.y", "gpu.z", "t.a", "t.b"]) == ["a", "gpu.*", "t.a", "t.b"]
