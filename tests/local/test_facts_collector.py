"""The facts collector (the node-side bundle's `facts` program) run for real on this machine."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from clustercheck.facts import model
from clustercheck.stages import bundle


def test_every_probe_of_the_collector_answers_on_this_machine(tmp_path):
    pyz = bundle.write(tmp_path)
    proc = subprocess.run(
        [sys.executable, pyz, "facts", "60", "--package", "pytest", "--package", "no-such-distribution"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    facts = json.loads(proc.stdout.strip().splitlines()[-1])
    # A probe that raised records only its error. Every declared fact reads what every Linux machine has (this one
    # lacks /proc/modules, so the kernel-module probe may fail soft here), and so do the probes read by hand.
    declared = {declaration.key for declaration in model.declared().values()}
    plain = sorted(declared - {"modules"} | {"torch", "disk_root", "launch_files", "gpu_bridges"})
    failed = {k: facts[k] for k in plain if isinstance(facts[k], dict) and set(facts[k]) == {"error"}}
    assert failed == {}, failed
    assert "pytest" in facts["packages"]["pip"]  # the environment's package list (drift between nodes)
    imports = facts["torch"]["packages"]  # the packages the inventory lists, imported beside torch
    assert "version" in imports["pytest"] and "error" not in imports["pytest"]
    assert imports["no-such-distribution"] == {"error": "not installed"}


def collect(tmp_path, python: str, *args: str, env=None) -> dict:
    pyz = bundle.write(tmp_path)
    proc = subprocess.run([python, pyz, "facts", "60", *args], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_torch_versions_from_its_metadata_are_what_the_import_says(tmp_path):
    """The collector reads torch's version and CUDA version from its installed files, not an import; they are the
    ones torch itself reports, and what only an import tells (devices, backends) comes from the import."""
    torch = pytest.importorskip("torch")
    found = collect(tmp_path, sys.executable)["torch"]
    assert found["version"] == torch.__version__ and found["cuda"] == torch.version.cuda
    assert found["cuda_available"] == torch.cuda.is_available()
    assert found["gloo"] == torch.distributed.is_gloo_available()


def test_a_python_without_torch_says_what_its_import_would(tmp_path):
    python = shutil.which("python3")
    imports = subprocess.run([python, "-c", "import torch"], capture_output=True, text=True)
    if imports.returncode == 0:
        pytest.skip(f"{python} has torch")
    said = imports.stderr.strip().splitlines()[-1]  # ModuleNotFoundError: No module named 'torch'
    found = collect(tmp_path, python, "--package", "no-such-distribution")["torch"]
    assert found == {"error": said, "packages": {"no-such-distribution": {"error": "not installed"}}}


def test_a_torch_that_fails_to_import_is_reported_with_the_import_error(tmp_path):
    """A torch whose import fails (here one on PYTHONPATH whose shared library is missing, as when a CUDA
    runtime library is absent) is named with the import's own error; the other packages are still judged."""
    fake = tmp_path / "site" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise OSError('libcudart.so.12: cannot open shared object file')\n")
    (fake / "version.py").write_text("__version__ = '2.13.0+cu128'\ncuda = '12.8'\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    found = collect(tmp_path, sys.executable, "--package", "pytest", env=env)["torch"]
    assert found["error"] == "OSError: libcudart.so.12: cannot open shared object file"
    assert "version" in found["packages"]["pytest"] and "error" not in found["packages"]["pytest"]
