"""torch.import reads a failed import for its cause: the probe runs without the working directory on sys.path, a
file shadowing a module is named (rename it), a broken install is reinstalled as the same build, a missing torch is
installed as the build the other nodes run; no fix installs an unpinned torch."""

from __future__ import annotations

import json
import subprocess
import sys

from clustercheck.checks import registry, torchinstall
from clustercheck.facts import collect
from clustercheck.inventory import Node
from clustercheck.model import CheckResult, Status
from clustercheck.remote.torchprobe import IMPORT_PROBE


def probe(cwd, *args: str, **env: str) -> dict:
    """The import probe as the collector runs it (`python -c`), in CWD."""
    answer = subprocess.run(
        [sys.executable, "-c", IMPORT_PROBE, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", **env},
    )
    assert answer.returncode == 0, answer.stderr
    return json.loads(answer.stdout.strip().splitlines()[-1])


def test_a_module_in_the_working_directory_does_not_shadow_what_the_probe_imports(tmp_path):
    (tmp_path / "json.py").write_text("raise RuntimeError('the working directory was on sys.path')\n")
    assert probe(tmp_path, "no-torch", "{}") == {"import_errors": {}}


def test_a_file_that_shadows_a_module_torch_imports_is_named(tmp_path):
    (tmp_path / "pkgs" / "torch").mkdir(parents=True)
    (tmp_path / "pkgs" / "torch" / "__init__.py").write_text("import helper\n")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "helper.py").write_text("raise RuntimeError('cannot initialize type')\n")
    path = f"{tmp_path / 'pkgs'}:{tmp_path / 'mine'}"
    found = probe(tmp_path, "torch", "{}", PYTHONPATH=path)
    assert found["error"].startswith("RuntimeError")
    assert found["shadow"] == {"module": "helper", "file": str((tmp_path / "mine" / "helper.py").resolve())}


def torch_import(raw_torch: dict, name: str = "node1") -> CheckResult:
    facts = collect.build(
        Node(name=name, address=name),
        {"python": {"version": "3.11.2"}, "torch": raw_torch, "commands": {}},
        python="/opt/env/bin/python",
        python_source="inventory",
    )
    return next(r for r in registry.run_node_checks(facts) if r.name == "torch.import")


def test_a_shadowing_file_is_the_cause_and_the_fix_renames_it():
    result = torch_import(
        {
            "error": 'RuntimeError: generic_type: cannot initialize type "GradBucket"',
            "installed": {"version": "2.13.0+cpu"},
            "shadow": {"module": "cuda", "file": "/home/me/cuda.py"},
        }
    )
    assert result.status is Status.FAIL and result.data["cause"] == "shadowed"
    assert "/home/me/cuda.py shadows the module cuda" in result.message
    assert "Rename /home/me/cuda.py" in result.remediation and "pip install" not in result.remediation


def test_a_broken_install_is_reinstalled_as_the_same_build():
    result = torch_import(
        {
            "error": "OSError: libtorch_cpu.so: cannot open shared object file: No such file or directory",
            "installed": {"version": "2.13.0+cpu"},
        }
    )
    assert result.data["cause"] == "broken" and "broken install" in result.message
    assert (
        "/opt/env/bin/python -m pip install --force-reinstall torch==2.13.0+cpu "
        "--index-url https://download.pytorch.org/whl/cpu" in result.remediation
    )


def test_a_missing_torch_is_installed_as_the_build_the_other_nodes_run():
    missing = torch_import({"error": "ModuleNotFoundError: No module named 'torch'"}, "node2")
    assert missing.data["cause"] == "missing" and "not installed" in missing.message
    assert "pip install torch " not in missing.remediation + " "  # never unpinned
    (pinned,) = torchinstall.with_pinned_torch(
        [missing], {"node1": "2.7.1+cu128", "node2": None, "node3": "2.7.1+cu128"}
    )
    assert "torch==2.7.1+cu128 --index-url https://download.pytorch.org/whl/cu128" in pinned.remediation
    (alone,) = torchinstall.with_pinned_torch([missing], {"node2": None})
    assert alone.remediation == missing.remediation


def test_a_pypi_build_is_pinned_without_an_index():
    pinned = torchinstall.pinned_install("python3", "2.13.0")
    assert pinned == "python3 -m pip install torch==2.13.0"  # contract: the command a user runs


def test_torch_missing_from_a_container_image_is_built_into_the_image():
    """An install into a running container dies with it: the fix builds an image FROM the one that lacks torch."""
    message, fix, found = torchinstall.import_failure(
        "/usr/bin/python3 in image base:1",
        "/usr/bin/python3",
        "ModuleNotFoundError: No module named 'torch'",
        {"error": "ModuleNotFoundError: No module named 'torch'"},
        "base:1",
    )
    assert found == {"cause": "missing", "error": "ModuleNotFoundError: No module named 'torch'", "image": "base:1"}
    assert "not installed" in message and "FROM base:1" in fix and "--container" in fix
    missing = CheckResult(
        "torch.import", Status.FAIL, message, "node2", fix, data={**found, "python": "/usr/bin/python3"}
    )
    (pinned,) = torchinstall.with_pinned_torch([missing], {"node1": "2.13.0+cpu", "node2": None})
    assert (
        "FROM base:1" in pinned.remediation
        and "RUN /usr/bin/python3 -m pip install torch==2.13.0+cpu" in pinned.remediation
    )
