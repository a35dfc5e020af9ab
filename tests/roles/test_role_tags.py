"""Each role runs on its own (`--tags X`) and with any other role skipped (`--skip-tags X`): the roles that
need to know the node's GPUs (nvidia_driver, cuda_toolkit, nccl, python_env) each bring the detection
(role nvidia_gpu) under their own tag, so no selection of tags leaves one of them without it.

Checked on what ansible-playbook itself selects (--list-tasks on site.yml); the stand-in tests run the
selections that once failed on a node."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent.parent
ROLES = [r["role"] for r in yaml.safe_load((REPO / "playbooks" / "nodes.yml").read_text())[1]["roles"]]
NEEDS_GPU = ["nvidia_driver", "cuda_toolkit", "nccl", "python_env"]
DETECT = "nvidia_gpu : NVIDIA GPU | PROBE |"
TASK = re.compile(r"^\s{6}(\S+) : (.*?)\tTAGS: \[(.*)\]$", re.M)


def listed(*args: str) -> list[tuple[str, str]]:
    """(role, task) in the order site.yml would run them with ARGS."""
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "--list-tasks", *args, "site.yml"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return [(m[1], m[2]) for m in TASK.finditer(proc.stdout) if not m[2].startswith("Validating arguments")]


@pytest.mark.parametrize("selection", [f"--tags={r}" for r in ROLES] + [f"--skip-tags={r}" for r in ROLES])
def test_gpu_detection_runs_before_every_role_that_needs_it(selection):
    tasks = listed(selection)
    for role in NEEDS_GPU:
        positions = [i for i, (r, _) in enumerate(tasks) if r == role]
        if not positions:
            continue  # the role is not selected
        detections = [i for i, (r, t) in enumerate(tasks) if f"{r} : {t}".startswith(DETECT)]
        assert detections and detections[0] < positions[0], f"{selection}: {role} runs without GPU detection before it"


def test_detection_is_its_own_role_not_tagged_with_others():
    tasks = listed("--skip-tags=python_env")
    assert any(r == "nvidia_driver" for r, _ in tasks), "nvidia_driver must run when python_env is skipped"
    assert DETECT in "\n".join(f"{r} : {t}" for r, t in tasks)
    assert "nvidia_gpu" not in ROLES, "detection is imported by the roles that need it, not listed in the play"


def test_every_fix_command_names_a_tag_of_site_yml_and_a_check_of_the_registry():
    """The mapping from checks to the roles that set what they check (checks/setup_roles.py) stays in step with
    site.yml's real tags, as ansible-playbook lists them, and with the check registry."""
    from clustercheck.checks import REGISTRY, setup_roles

    proc = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "--list-tags", "site.yml"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    tags = {t.strip() for line in re.findall(r"TASK TAGS: \[(.*)\]", proc.stdout) for t in line.split(",")}
    assert set(setup_roles.ROLE_OF.values()) <= tags - {"always"}
    assert set(setup_roles.ROLE_OF) <= set(REGISTRY)
