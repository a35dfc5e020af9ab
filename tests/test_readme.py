"""The README's commands are the ones that run: CI runs the test command word for word."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def readme_commands() -> list[str]:
    blocks = re.findall(r"```sh\n(.*?)```", (REPO / "README.md").read_text(), re.S)
    return [b.strip() for b in blocks]


def test_ci_runs_the_readme_test_command():
    test_command = next(c for c in readme_commands() if c.endswith("pytest"))
    assert test_command in (REPO / ".ci/run").read_text().splitlines()


def quick_start_lines() -> list[str]:
    """The Quick start's commands, one a line, comments off."""
    text = (REPO / "README.md").read_text().split("## Quick start\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```sh\n(.*?)```", text, re.S)
    return [line.split("#")[0].strip() for block in blocks for line in block.splitlines()]


def test_readme_main_job_checks_localhost():
    lines = quick_start_lines()
    assert ".venv/bin/clustercheck run --hosts localhost" in lines
    installs = [line for line in lines if " install " in line and "-e '.[torch]'" in line]
    assert len(installs) == 2  # without a GPU (the CPU index first), and with one
    assert all("-c constraints.txt" in line for line in installs)  # the tested versions
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in installs[0]  # not the multi-GB CUDA build
    assert lines.index(".venv/bin/clustercheck run --hosts localhost") > lines.index(installs[0])


def test_the_quick_start_environment_has_numpy():
    """The Quick start installs '.[torch]'; without numpy torch warns "Failed to initialize NumPy" on every rank."""
    import tomllib
    from packaging.requirements import Requirement

    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert "'.[torch]'" in readme_commands()[0]
    for extra in ("torch", "test"):
        assert "numpy" in {Requirement(r).name for r in extras[extra]}, extra
    pins = (REPO / "constraints.txt").read_text().splitlines()
    assert any(line.startswith("numpy==") for line in pins)


def test_the_checks_doc_s_tables_are_the_catalog():
    from clustercheck import catalog

    text = (REPO / "docs" / "checks.md").read_text()
    listed = re.search(r"<!-- BEGIN checks[^\n]*-->\n(.*?)<!-- END checks -->", text, re.S)
    assert listed, "docs/checks.md lost its generated checks tables"
    assert listed.group(1) == catalog.markdown_tables(), "regenerate: scripts/checks_docs.py"


def test_readme_stage_table_is_the_stage_list():
    from clustercheck import catalog

    text = (REPO / "README.md").read_text()
    listed = re.search(r"<!-- BEGIN stages[^\n]*-->\n(.*?)<!-- END stages -->", text, re.S)
    assert listed, "the README lost its generated stage table"
    assert listed.group(1) == catalog.stage_table(), "regenerate: scripts/checks_docs.py"


def test_the_acceptance_suite_without_an_inventory_is_one_usage_error_in_the_lanes_too():
    """The README's acceptance command needs --ansible-inventory: without it, one line and pytest's usage-error
    status, before anything runs, with the test lanes (pyproject's -n 2) as in one process."""
    import subprocess
    import sys

    for lanes in ("2", "0"):
        cmd = [sys.executable, "-m", "pytest", "tests/acceptance", "--hosts=local://", "-p", "no:cacheprovider"]
        proc = subprocess.run([*cmd, "-n", lanes], cwd=REPO, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 4, proc.stdout[-2000:] + proc.stderr[-2000:]
        said = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
        assert said == ["ERROR: the acceptance tests need --ansible-inventory=PATH (the inventory site.yml ran with)"]


def test_the_readme_is_a_guide_of_at_most_500_lines():
    """Measurements, verification records and reference tables live in docs/; the README is the path through."""
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= 500, f"the README has {len(lines)} lines: move reference material to docs/"


def test_the_readme_links_every_docs_page_once_in_its_links():
    text = (REPO / "README.md").read_text()
    links = text.split("\n## Links\n", 1)[1].split("\n## ", 1)[0]
    listed = re.findall(r"^- \[docs/([\w.-]+\.md)\]\(docs/\1\): \S", links, re.M)
    assert sorted(listed) == sorted(p.name for p in (REPO / "docs").glob("*.md"))
