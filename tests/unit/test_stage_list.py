"""One stage list (clustercheck/selection.py): the pipeline's modules, the command line and the catalog follow it."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from clustercheck import catalog, checks, stages
from clustercheck.commands import cli
from clustercheck.selection import DECLARED, DISTRIBUTED, STAGES


def test_every_multinode_stage_is_a_module_named_as_its_stage():
    modules = stages.modules()
    assert list(modules) == list(DISTRIBUTED) == [s.name for s in DECLARED[1:] if s.asked_by is None]
    assert [s.name for s in DECLARED if s.asked_by] == ["baseline"]  # compared by the pipeline, not a module
    assert all(name == module.NAME for name, module in modules.items())


def test_the_stage_modules_are_listed_by_name_and_every_stage_module_is_listed():
    """stages.MODULES names the multi-node stage modules (no import by computed name), in the declared order; a
    module under clustercheck/stages/ with a stage's interface (NAME and run) is one of them."""
    source = (Path(stages.__file__).parent / "__init__.py").read_text()
    assert "importlib" not in source
    assert [m.NAME for m in stages.MODULES] == list(DISTRIBUTED)
    listed = {Path(m.__file__).stem for m in stages.MODULES}
    shaped = {
        path.stem
        for path in Path(stages.__file__).parent.glob("*.py")
        if "\nNAME = " in path.read_text() and "\ndef run(" in path.read_text()
    }
    assert shaped == listed == set(DISTRIBUTED)


def test_every_check_belongs_to_a_declared_stage_and_every_stage_has_checks():
    assert {c.stage for c in checks.REGISTRY.values()} == set(STAGES)


def test_the_command_line_offers_the_declared_stages():
    text = CliRunner().invoke(cli, ["run", "--help"], terminal_width=400).output
    skippable = [s for s in STAGES if s != "core"]  # baseline too: --skip takes every stage but core
    assert f"Skip a stage ({', '.join(skippable)})" in " ".join(text.split())
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


def test_a_skip_that_names_no_stage_and_no_check_is_refused_as_an_only_would_be():
    """`--skip ddpp` and `--skip gpu.cnt` left everything in and said nothing; now they are usage errors, in one line
    naming the stages and where the checks are listed, before anything runs."""
    from clustercheck.launcher.preflight import PREFLIGHT
    from clustercheck.selection import Selection, SelectionError

    stages = ", ".join(STAGES[1:])
    for typo in ("ddpp", "gpu.cnt", "locl.*"):
        out = CliRunner().invoke(cli, ["run", "--hosts", "gpu1.invalid", "--skip", "ddp", "--skip", typo])
        assert out.exit_code == 4, out.output  # a usage error (the command line says `clustercheck: error:`)
        said = f"--skip {typo}: not a stage ({stages}) and no check's name matches it (clustercheck checks lists them)"
        assert out.output.strip().splitlines() == [f"Error: {said}"]
    names = list(checks.REGISTRY)
    for fine in (("ddp", "baseline"), ("local.*",), ("gpu.count", "network.r*"), ("consistency.*", "lightning")):
        assert Selection(skip=fine).against(names).skip == fine
    assert PREFLIGHT.against(names) is PREFLIGHT  # the launch's own selection
    try:
        Selection(skip=("gpu.cnt",)).against(names)
    except SelectionError as exc:
        assert str(exc).startswith("--skip gpu.cnt: not a stage")
    else:
        raise AssertionError("--skip gpu.cnt was taken")


def test_the_distributed_checks_doc_counts_and_names_every_declared_stage():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "distributed-checks.md").read_text()
    first = " ".join(doc.split("\n\n")[1].split())
    words = {5: "five", 6: "six", 7: "seven", 8: "eight", 9: "nine"}
    assert first.startswith(f"`clustercheck run` has {words[len(STAGES)]} stages, run in this order:")
    named = [stage for stage in STAGES if f"**{stage}**" in first]
    assert named == list(STAGES) and [first.index(f"**{s}**") for s in named] == sorted(
        first.index(f"**{s}**") for s in named
    )
