"""The `ubuntu` driver source for real: Canonical's NVIDIA server driver packages on an Ubuntu 24.04 node.

Canonical's archive is reachable from the test machines, so nothing of the driver is a stand-in here:
nvidia-driver-580-server-open, nvidia-utils-580-server (restricted), nvidia-fabricmanager-580 and
libnvidia-nscq-580 (multiverse) resolve, install (about 400 MB, through the control machine's apt cache)
and are held, and a second run changes nothing. The node has no GPU: its /sys is modelled in a directory
the roles read instead (nvidia_gpu_sysfs_root, for tests only) with a GPU and an NVSwitch on the bus.
What cannot run without one (loading the module, nvidia-smi, persistence mode in effect, fabric manager
running) is listed in docs/verification.md ("What was verified where"). CUDA and NCCL come from the stand-in NVIDIA
repository (tests/ansible/standins): that is where NVIDIA's builds of the same package names appear, and
they must stay out of a node whose driver comes from Canonical.
"""

from __future__ import annotations

import re

import pytest
from conftest import own_cluster
from test_nvidia_standins import docker_sh, installed, play, served, ssh, unchanged

pytestmark = pytest.mark.cluster
SYSFS = "/root/sysfs-standin"
MODEL_SYSFS = f"""
set -e
d={SYSFS}/bus/pci/devices/0000:18:00.0; mkdir -p $d; echo 0x10de > $d/vendor; echo 0x030200 > $d/class
d={SYSFS}/bus/pci/devices/0000:05:00.0; mkdir -p $d; echo 0x10de > $d/vendor; echo 0x068000 > $d/class
"""
CANONICAL = [
    "nvidia-driver-580-server-open",
    "nvidia-utils-580-server",
    "nvidia-fabricmanager-580",
    "libnvidia-nscq-580",
]


@pytest.fixture(scope="module")
def ub_node():
    """One Ubuntu 24.04 node reached as a non-root user with sudo, as cloud images are; removed afterwards."""
    with own_cluster(1, "Ubuntu 24.04 test node", suffix="-ub", os_name="ubuntu24.04", user="ops") as cluster:
        docker_sh(cluster, MODEL_SYSFS)
        yield cluster


@pytest.fixture(scope="module")
def ub_repo(ub_node):
    with served(ub_node, "ubuntu2404") as repo:
        yield repo


def ubuntu_play(cluster, repo, *args: str):
    return play(cluster, repo, "nvidia-standins.yml", "-e", "nvidia_driver_source=ubuntu", *args)


def test_a_missing_component_is_named(ub_node, ub_repo):
    """The node's sources have main, restricted and universe: Canonical's fabric manager is in multiverse."""
    proc = ubuntu_play(ub_node, ub_repo)
    assert proc.returncode != 0
    assert "the apt sources offer no nvidia-fabricmanager-580, libnvidia-nscq-580" in proc.stdout, proc.stdout[-3000:]
    assert "multiverse" in proc.stdout
    assert not any(name.startswith("nvidia-driver") for name in installed(ub_node))


def test_canonicals_packages_install_held_and_from_canonical_only(ub_node, ub_repo):
    docker_sh(
        ub_node,
        "sed -i 's/^Components: main restricted universe$/& multiverse/' /etc/apt/sources.list.d/ubuntu.sources",
    )
    proc = ubuntu_play(ub_node, ub_repo)
    assert proc.returncode == 0, proc.stdout[-5000:]
    versions = installed(ub_node)
    driver = versions["nvidia-driver-580-server-open"]
    assert re.fullmatch(r"580\.\d+\.\d+-0ubuntu0\.24\.04\.\d+", driver), driver
    assert all(versions[name] == driver for name in CANONICAL), {n: versions.get(n) for n in CANONICAL}
    assert set(CANONICAL) <= set(ssh(ub_node, "apt-mark showhold").split())
    # From Canonical's archive, and NVIDIA's builds of the same names never candidates.
    policy = ssh(ub_node, "apt-cache policy nvidia-fabricmanager-580 nvidia-fabricmanager libnvidia-nscq")
    sections = {part.split(":", 1)[0]: part for part in re.split(r"\n(?=\S)", policy.strip())}
    assert "archive.ubuntu.com" in sections["nvidia-fabricmanager-580"], policy
    for nvidia_name in ("nvidia-fabricmanager", "libnvidia-nscq"):  # offered by NVIDIA's repository, pinned out
        assert "Candidate: (none)" in sections[nvidia_name] and "580.105.08-1 -1" in sections[nvidia_name], policy
    assert "Inst " not in ssh(ub_node, "apt-get -s -o Debug::NoLocking=1 dist-upgrade | grep -i nvidia; true")
    # Canonical's real persistenced unit, its ExecStart switched to persistence mode; nothing started.
    exec_start = ssh(ub_node, "systemctl show -p ExecStart --value nvidia-persistenced")
    assert "--user nvidia-persistenced --persistence-mode --verbose" in exec_start, exec_start
    assert "NEEDS A REBOOT: driver 580." in proc.stdout
    assert ssh(ub_node, "systemctl is-active nvidia-persistenced nvidia-fabricmanager; true").split() == [
        "inactive",
        "inactive",
    ]


def test_second_run_changes_nothing(ub_node, ub_repo):
    unchanged(ubuntu_play(ub_node, ub_repo))
