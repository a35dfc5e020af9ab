"""`clustercheck run --hosts localhost --container IMAGE` on this machine's own Docker: the torch side inside an image
built here as a site builds its own (Debian 12 with the CPU torch wheel), an image without torch, and one that is not
there."""

from __future__ import annotations

import json
import subprocess

import nodeimages
import pytest
from conftest import TORCH_PIN, _need_docker
from harness import CLUSTERCHECK, run_cli

pytestmark = pytest.mark.cluster  # this machine's own Docker, no test cluster


def docker(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def torch_image(wheelhouse) -> str:
    _need_docker()
    return nodeimages.ensure_torch_image(wheelhouse, TORCH_PIN)


@pytest.fixture(scope="module")
def memlock(torch_image) -> list[str]:
    """NVIDIA's memlock=-1 where this Docker allows it; else the limit it allows, given the way a user of such a
    Docker gives it (dockerd here runs without the capability to raise it: tests/unit/data/docker/README.md)."""
    if docker("run", "--rm", "--ulimit", "memlock=-1", torch_image, "true").returncode == 0:
        return []
    kib = docker("run", "--rm", torch_image, "sh", "-c", "ulimit -l").stdout.strip()
    limit = "-1" if kib == "unlimited" else str(int(kib) * 1024)
    return [f"--container-option=--ulimit=memlock={limit}:{limit}"]


def checks_of(proc: subprocess.CompletedProcess) -> dict[str, dict]:
    return {c["name"]: c for c in json.loads(proc.stdout)["checks"]}


def left_behind() -> str:
    return docker("ps", "-a", "--filter", "label=clustercheck.run", "--format", "{{.ID}} {{.Image}}").stdout.strip()


def test_ddp_equivalence_and_the_collectives_run_inside_the_image(torch_image, memlock, tmp_path):
    run_dir = tmp_path / "run"
    proc = run_cli(
        "run", "--hosts", "localhost", "--container", torch_image, *memlock, "--skip", "lightning",
        "--format", "json", "--run-dir", str(run_dir), "--master-port", "29631",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    checks = checks_of(proc)
    ident = docker("image", "inspect", "--format", "{{.Id}}", torch_image).stdout.strip()
    assert checks["container.docker"]["status"] == "PASS"
    assert checks["container.image"]["status"] == "PASS" and checks["container.image"]["data"]["id"] == ident
    # python and torch are the image's (the control machine's own python runs clustercheck, with its own torch)
    assert (
        checks["python.env"]["message"]
        == f"localhost: /usr/bin/python3 in image {torch_image} (Python 3.11.2, --container)"
    )
    assert checks["torch.import"]["message"].startswith(
        f"localhost: torch 2.13.0+cpu imports with /usr/bin/python3 in image {torch_image}"
    )
    for name in ("allreduce", "allgather", "broadcast", "ddp_equivalence", "checkpoint"):
        assert checks[name]["status"] == "PASS", checks[name]["message"]
    assert checks["ddp_equivalence"]["data"]["world_size"] == 2
    command = (run_dir / "hosts" / "localhost" / "torch.command").read_text()
    assert " --ipc host " in command and f" {torch_image} /usr/bin/python3 -m torch.distributed.run " in command
    assert left_behind() == ""  # every container of the run is gone (docker run --rm, the run's label)


def test_an_image_without_torch_is_named(memlock, tmp_path):
    base = nodeimages.ensure_image()  # the test nodes' image: Debian 12's python3, no torch
    proc = run_cli(
        "run", "--hosts", "localhost", "--container", base, *memlock, "--only", "core",
        "--format", "json", "--run-dir", str(tmp_path / "run"),
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    checks = checks_of(proc)
    assert checks["container.image"]["status"] == "PASS"
    torch = checks["torch.import"]
    assert torch["status"] == "FAIL"
    message = torch["message"]
    assert message.startswith("localhost: torch is not installed")
    assert f"/usr/bin/python3 in image {base}" in message and "No module named 'torch'" in message
    assert torch["data"]["cause"] == "missing"
    assert f"FROM {base}" in torch["remediation"] and "torch==" in torch["remediation"]


def test_an_image_that_is_not_there_is_one_fail_with_its_fix(memlock, tmp_path):
    proc = run_cli(
        "run", "--hosts", "localhost", "--container", "clustercheck-absent:none", *memlock, "--only", "core",
        "--format", "json", "--run-dir", str(tmp_path / "run"),
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    checks = checks_of(proc)
    image = checks["container.image"]
    assert (
        image["status"] == "FAIL" and image["message"] == "localhost: image clustercheck-absent:none is not on the node"
    )
    assert "docker pull clustercheck-absent:none" in image["remediation"]
    assert [n for n, c in checks.items() if c["status"] == "FAIL"] == ["container.image"]
    assert checks["torch.import"]["status"] == "SKIP"
    assert left_behind() == ""


def test_container_options_need_a_container():
    proc = run_cli("run", "--hosts", "localhost", "--container-option=--shm-size=1g")
    assert proc.returncode == 4
    assert proc.stderr.strip() == "clustercheck: error: --container-option: only with --container IMAGE"


JOB = """\
import os, sys
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
total = torch.ones(1) * (dist.get_rank() + 1)
dist.all_reduce(total)
print(f"rank {dist.get_rank()} of {dist.get_world_size()}: sum {total.item():g}, {sys.executable} in {os.getcwd()}")
dist.destroy_process_group()
"""


def test_launch_runs_the_users_script_inside_the_image_where_it_lies(torch_image, memlock, tmp_path):
    code = tmp_path / "code"
    code.mkdir()
    (code / "job.py").write_text(JOB)
    proc = subprocess.run(
        [CLUSTERCHECK, "launch", "--hosts", "localhost", "--container", torch_image, *memlock,
         "--nproc-per-node", "2", "--run-dir", str(tmp_path / "run"), "--master-port", "29641", "--", "job.py"],
        cwd=code, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    ranks = sorted(line for line in proc.stdout.splitlines() if ": rank " in line)
    # the image's python, in the directory the script lies in on the node (mounted there), the ranks meeting
    assert ranks == [f"localhost/{r}: rank {r} of 2: sum 3, /usr/bin/python3 in {code}" for r in (0, 1)], proc.stdout[
        -2000:
    ]
    assert "preflight passed" in proc.stderr
    assert left_behind() == ""
