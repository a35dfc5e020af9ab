"""Shared fixtures: the Docker test cluster and the torch wheelhouse for offline nodes."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "cluster"))
import testcluster
import torchenv

REPO = Path(__file__).resolve().parent.parent
IN_CI = os.environ.get("CI", "").lower() == "true"
TORCH_PIN = "torch==2.13.0"


def _need_docker() -> None:
    """Outside CI, no Docker means the multi-node tests are skipped; in CI it is a failure."""
    try:
        testcluster.ensure_docker(start=os.geteuid() == 0)
    except testcluster.ClusterError as exc:
        if IN_CI:
            pytest.fail(f"the test cluster needs Docker, and CI must run the multi-node tests: {exc}")
        pytest.skip(f"no Docker engine: {exc}")


@pytest.fixture(scope="session")
def cluster():
    """Three fresh Debian 12 nodes on a private network, reached over SSH; removed afterwards.

    TESTCLUSTER_NAME names the cluster, so separate checkouts can test side by side.
    """
    _need_docker()
    name = os.environ.get("TESTCLUSTER_NAME", testcluster.DEFAULT_NAME)
    try:
        up = testcluster.up(3, name=name)
    except testcluster.ClusterError as exc:
        pytest.fail(f"test cluster did not come up: {exc}")
    yield up
    testcluster.down(name)


@pytest.fixture(scope="session")
def wheelhouse() -> Path:
    """A directory of wheels with torch (CPU build) and its dependencies, built on the control machine.

    Nodes cannot reach PyPI, like an air-gapped site: they install from this directory with --no-index.
    """
    target = testcluster.CACHE_DIR / "wheelhouse"
    stamp = target / ".complete"
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / ".wheelhouse.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one builder at a time across test sessions
        if stamp.exists() and stamp.read_text().strip() == TORCH_PIN:
            return target
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        pip = [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "-d", str(target)]
        subprocess.run([*pip, "-c", str(REPO / "constraints.txt"), TORCH_PIN], check=True)
        stamp.write_text(TORCH_PIN + "\n")
    return target


@pytest.fixture(scope="session")
def torch_cluster(cluster, wheelhouse):
    """The session cluster with torch 2.13.0 (CPU) in /opt/clustercheck/venv on every node, recorded in
    /etc/clustercheck/python; installed once per session, shared by tests/integration and tests/distributed."""
    errors = torchenv.install(cluster, wheelhouse)
    if errors:
        pytest.fail("installing the torch environment on the nodes failed: " + "; ".join(errors))
    return cluster
