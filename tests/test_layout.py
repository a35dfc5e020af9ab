"""The README's table of test folders (`### Tests, by what they need`) is true: it lists every folder under tests/,
the folders it says need nothing collect with neither torch nor Docker there, and every test that starts a test
cluster carries the `cluster` marker (so `-m "not cluster"` runs without Docker), none in a folder that needs no
Docker. Each check collects the suite in a child pytest (collection only: seconds); the lanes' check runs a few
quick tests in two workers."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parent.parent
TESTS = REPO / "tests"
DOCKER = "Docker"

# A plugin for the child pytest: with BLOCK_TORCH set, torch and lightning cannot be imported; after collection it
# writes each test's folder, markers and whether it starts a test cluster (its function, or a fixture it uses,
# calls own_cluster or testcluster.up) to $OUT as JSON.
PLUGIN = """
import importlib.abc, inspect, json, os, sys
from pathlib import Path

if os.environ.get("BLOCK_TORCH"):
    class _NoTorch(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("torch", "lightning", "pytorch_lightning"):
                raise ImportError(f"{name} is blocked: this folder must not need torch")
            return None
    sys.meta_path.insert(0, _NoTorch())

STARTS = ("own_cluster(", "testcluster.up(")

def _starts_cluster(func):
    try:
        return any(s in inspect.getsource(func) for s in STARTS)
    except (OSError, TypeError):
        return False

def _folder(path):
    parts = path.relative_to(os.environ["TESTS"]).parts if path.is_relative_to(os.environ["TESTS"]) else ()
    return parts[0] if len(parts) > 1 else ""

def pytest_collection_finish(session):
    items = []
    for item in session.items:
        funcs = [getattr(item, "function", None)]
        funcs += [d.func for defs in item._fixtureinfo.name2fixturedefs.values() for d in defs]
        items.append({
            "nodeid": item.nodeid,
            "folder": _folder(Path(str(item.path))),
            "markers": sorted({m.name for m in item.iter_markers()}),
            "starts_cluster": any(_starts_cluster(f) for f in funcs if f is not None),
        })
    Path(os.environ["OUT"]).write_text(json.dumps(items))
"""


def readme_table() -> dict[str, str]:
    """Folder name -> what it needs, from the README's table."""
    text = (REPO / "README.md").read_text()
    table = text.split("### Tests, by what they need", 1)[1].split("\n\n", 2)[1]
    needs = {}
    for row in table.splitlines()[2:]:
        cells = [c.strip() for c in row.strip("|").split("|")]
        folder = re.fullmatch(r"`tests/(\w+)/`", cells[0])
        assert folder, row
        needs[folder.group(1)] = cells[2]
    return needs


def collect(tmp_path: Path, *args: str, block_torch: bool = False) -> list[dict]:
    (tmp_path / "layout_plugin.py").write_text(PLUGIN)
    out = tmp_path / "items.json"
    env = {**os.environ, "TESTS": str(TESTS), "OUT": str(out), "PYTHONPATH": str(tmp_path)}
    if block_torch:
        env["BLOCK_TORCH"] = "1"
        # No Docker either: a `docker` first on PATH that fails, as on a machine without it.
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        (bin_dir / "docker").write_text("#!/bin/sh\necho 'docker: not installed' >&2\nexit 127\n")
        (bin_dir / "docker").chmod(0o755)
        env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    cmd = [sys.executable, "-m", "pytest", "-c", str(REPO / "pyproject.toml"), "--collect-only", "-q", "-n", "0"]
    cmd += ["-p", "no:cacheprovider", "-p", "layout_plugin"]
    proc = subprocess.run([*cmd, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    return json.loads(out.read_text())


def test_the_table_lists_every_test_folder():
    folders = {p.name for p in TESTS.iterdir() if p.is_dir() and not p.name.startswith((".", "__"))}
    assert set(readme_table()) == folders


def pytest_options() -> dict:
    import tomllib  # Python 3.11+, as tests/test_readme.py reads pyproject.toml

    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]


def test_the_marker_is_declared():
    assert any(m.startswith("cluster:") for m in pytest_options()["markers"])


def test_the_plain_run_takes_every_folder_those_without_docker_first():
    """The README's test command runs every folder but tests/acceptance (your own cluster), and the folders that
    need no Docker before those that do: they run while the node images download in the background."""
    needs = readme_table()
    folders = [path.split("/")[1] for path in pytest_options()["testpaths"] if not path.endswith(".py")]
    assert sorted(folders) == sorted(f for f, need in needs.items() if need != "a cluster")
    docker = [needs[f] == DOCKER for f in folders]
    assert docker == sorted(docker), folders


def test_the_folders_that_need_nothing_collect_without_torch_or_docker(tmp_path):
    plain = sorted(f for f, needs in readme_table().items() if needs == "nothing")
    assert "unit" in plain
    items = collect(tmp_path, *(f"tests/{f}" for f in plain), block_torch=True)
    assert {i["folder"] for i in items} == set(plain)
    assert [i["nodeid"] for i in items if "cluster" in i["markers"] or i["starts_cluster"]] == []


def test_every_test_that_starts_a_cluster_carries_the_marker(tmp_path):
    needs = readme_table()
    items = collect(tmp_path, "tests")
    starting = [i for i in items if i["starts_cluster"]]
    assert starting, "no test starts a test cluster: the check below would prove nothing"
    assert [i["nodeid"] for i in starting if "cluster" not in i["markers"]] == []
    marked_elsewhere = [i["nodeid"] for i in items if "cluster" in i["markers"] and DOCKER not in needs[i["folder"]]]
    assert marked_elsewhere == []
    for folder in {i["folder"] for i in starting}:
        assert needs[folder] == DOCKER, folder


# A test that starts a cluster through a fixture and lacks the marker (the collection must see both).
PROBE = """
import pytest
from conftest import own_cluster

@pytest.fixture
def small():
    with own_cluster(1, "probe") as up:
        yield up

def test_uses_it(small):
    pass
"""


def test_a_marker_missing_on_a_cluster_test_is_found(tmp_path):
    """The collection above sees a test that starts a cluster through a fixture, without the marker."""
    probe = tmp_path / "probe"
    probe.mkdir()
    (probe / "test_probe.py").write_text(PROBE)
    items = [i for i in collect(tmp_path, str(probe)) if "probe" in i["nodeid"]]
    assert [(i["starts_cluster"], i["markers"]) for i in items] == [(True, [])]


def test_lanes_keep_a_group_on_one_worker():
    """Two lanes (pyproject's `-n 2`): the tests of a group run on one worker, so a test cluster is made once and
    localhost's fixed ports are never taken twice at a time. xdist's own scope (the module) would split these two
    tests/local modules between the workers; tests/conftest.py's scheduler must not."""
    local = [
        "tests/local/test_launch_cli.py::test_no_script_is_a_usage_error",
        "tests/local/test_node_health.py::test_bad_input_is_one_line_and_exit_4",
    ]
    spread = [
        f"tests/unit/test_inventory.py::{name}"
        for name in ("test_ansible_variables_and_group_vars_are_read", "test_host_list_forms")
    ]
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-c",
        str(REPO / "pyproject.toml"),
        "-n",
        "2",
        "-v",
        "-p",
        "no:cacheprovider",
    ]
    proc = subprocess.run([*cmd, *local, *spread], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ran = re.findall(r"^\[(gw\d+)\] \[\s*\d+%\] PASSED (\S+)", proc.stdout, re.M)
    workers = {worker for worker, test in ran if test.startswith("tests/local/")}
    assert len([t for _, t in ran if t.startswith("tests/local/")]) >= 4, proc.stdout[-3000:]
    assert len(workers) == 1, ran
    assert {worker for worker, _ in ran} == {"gw0", "gw1"}, ran  # the rest spread over both


def test_without_the_lanes_plugin_the_configured_options_mean_one_process():
    """`-p no:xdist`: pyproject's addopts carry the lanes' options, which are then accepted and mean one process (they
    were refused: unrecognized arguments), and the lanes' hooks in tests/conftest.py are optional (with the addopts
    left out, they were an INTERNALERROR: unknown hook 'pytest_configure_node')."""
    test = "tests/unit/test_inventory.py::test_host_list_forms"
    for extra in ([], ["-o", "addopts="]):
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            "-c",
            str(REPO / "pyproject.toml"),
            "-p",
            "no:xdist",
            "-p",
            "no:cacheprovider",
        ]
        proc = subprocess.run([*cmd, *extra, test], cwd=REPO, capture_output=True, text=True, timeout=300)
        said = proc.stdout[-3000:] + proc.stderr[-3000:]
        assert proc.returncode == 0 and "INTERNALERROR" not in said, said
        assert re.search(r"\b1 passed\b", proc.stdout) and "[gw" not in proc.stdout, said


def test_the_lanes_take_the_costliest_group_first_and_keep_each_group_together(monkeypatch):
    """A worker's collection, which the scheduler hands out in order: the groups by their measured minutes, the
    costliest first, each group's tests together in the order they were collected, the tests of no group last."""
    import conftest

    def item(nodeid: str, *fixtures: str) -> SimpleNamespace:
        path = REPO / nodeid.split("::")[0]
        marker = "cluster" if fixtures or "tests/cluster/" in nodeid else None
        return SimpleNamespace(
            nodeid=nodeid,
            path=path,
            fixturenames=list(fixtures),
            get_closest_marker=lambda name: marker == name or None,
        )

    collected = [
        item("tests/unit/test_inventory.py::test_a"),
        item("tests/local/test_cli.py::test_b"),
        item("tests/cluster/test_run.py::test_c", "torch_cluster"),
        item("tests/ansible/test_site_playbook.py::test_d", "converged_cluster"),
        item("tests/unit/test_inventory.py::test_e"),
        item("tests/local/test_cli.py::test_f"),
        item("tests/faults/test_faults.py::test_g", "converged_cluster"),
        item("tests/cluster/test_run.py::test_h", "torch_cluster"),
    ]
    monkeypatch.setattr(conftest, "LANE_MINUTES", {"converged_cluster": 30.0, "torch_cluster": 12.0, "localhost": 6.0})
    items = list(collected)
    conftest.pytest_collection_modifyitems(SimpleNamespace(workerinput={}), items)
    assert [i.nodeid.rsplit("_", 1)[1] for i in items] == ["d", "g", "c", "h", "b", "f", "a", "e"]
    items = list(collected)
    conftest.pytest_collection_modifyitems(SimpleNamespace(), items)  # one process: pyproject's order
    assert items == collected


# Two tests on one cluster state: the first spoils it, the second asks for it (a stand-in: no Docker needed).
SPOILED = """
import pytest
from conftest import spoil

@pytest.fixture(scope="session")
def bare_cluster():
    return type("Nodes", (), {})()

def test_leaves_a_node_changed(bare_cluster):
    spoil(bare_cluster, "test_leaves_a_node_changed left node2's /etc/hosts changed")

def test_comes_after(bare_cluster):
    pass
"""


def test_a_spoiled_cluster_fails_every_later_test_that_asks_for_it_saying_why(tmp_path):
    probe = tmp_path / "test_spoiled.py"
    probe.write_text(SPOILED)
    cmd = [sys.executable, "-m", "pytest", "-c", str(REPO / "pyproject.toml"), "-n", "0", "-p", "no:cacheprovider"]
    proc = subprocess.run([*cmd, "-p", "conftest", "-v", str(probe)], cwd=REPO, capture_output=True, text=True)
    assert re.findall(r"::(\w+)(?: <- \S+)? (PASSED|FAILED|ERROR)", proc.stdout) == [
        ("test_leaves_a_node_changed", "PASSED"),
        ("test_comes_after", "ERROR"),
    ], proc.stdout[-3000:]
    said = "bare_cluster is not in its state: test_leaves_a_node_changed left node2's /etc/hosts changed"
    assert said in proc.stdout, proc.stdout[-3000:]
