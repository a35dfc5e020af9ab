"""The NVIDIA roles (cuda_repo source) against a signed local repository of TEST DOUBLE packages.

No GPU and no access to NVIDIA's repository here: a one-node cluster of its own (so the shared
session cluster never sees stand-in drivers) gets the repository over HTTP from the control machine,
on its Docker network's gateway address, with GPU detection forced. Repository setup, key check,
version pins, holds and services run for real.
"""

from __future__ import annotations

import functools
import http.server
import ipaddress
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import REPO, own_cluster
from test_site_playbook import recap

sys.path.insert(0, str(Path(__file__).parent / "standins"))
import build_repo

pytestmark = pytest.mark.cluster
HERE = Path(__file__).resolve().parent
SB_VAR = "/root/SecureBoot-standin"


@pytest.fixture(scope="module")
def nv_node():
    """A one-node cluster of its own, removed afterwards."""
    with own_cluster(1, "stand-in test node", suffix="-nv") as cluster:
        yield cluster


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # apt's requests are not test output
        pass


@pytest.fixture(scope="module")
def standin_repo(nv_node, tmp_path_factory):
    """The stand-in repository, served on the node network's gateway (reachable from the node only)."""
    repo = build_repo.build(tmp_path_factory.mktemp("standin-repo"))
    gateway = str(next(ipaddress.ip_network(nv_node.subnet).hosts()))  # Docker's bridge address on the host
    handler = functools.partial(_QuietHandler, directory=str(repo.path))
    server = http.server.ThreadingHTTPServer((gateway, 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    repo.url = f"http://{gateway}:{server.server_address[1]}"
    yield repo
    server.shutdown()
    server.server_close()


def play(cluster, repo, playbook: str, *args: str) -> subprocess.CompletedProcess:
    cmd = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", cluster.inventory, str(HERE / playbook)]
    cmd += ["-e", "nvidia_driver_force_gpu=true", "-e", "nvidia_driver_fabricmanager=true"]
    cmd += ["-e", f"nvidia_repo_url={repo.url}", "-e", f"nvidia_repo_key_fingerprint={repo.fingerprint}"]
    cmd += ["-e", f"nvidia_repo_keyring_sha256={repo.keyring_sha256}", *args]
    env = {**os.environ, "ANSIBLE_NOCOLOR": "1"}
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900, env=env)


def ssh(cluster, command: str) -> str:
    node = cluster.nodes[0]
    options = [
        "-o",
        f"UserKnownHostsFile={cluster.known_hosts}",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "BatchMode=yes",
    ]
    proc = subprocess.run(
        ["ssh", "-i", cluster.key_file, *options, f"root@{node.address}", command],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, f"{command}: {proc.stderr}"
    return proc.stdout


def test_secure_boot_on_stops_the_driver_role(nv_node, standin_repo):
    node = nv_node.nodes[0]
    # An EFI variable as the firmware writes it: 4 attribute bytes, then 1 (Secure Boot on).
    subprocess.run(
        ["docker", "exec", node.container, "sh", "-c", f"printf '\\007\\000\\000\\000\\001' > {SB_VAR}"], check=True
    )
    proc = play(nv_node, standin_repo, "nvidia-standins.yml", "-e", f"nvidia_driver_secure_boot_efivar={SB_VAR}")
    assert proc.returncode != 0
    assert "Secure Boot is on" in proc.stdout and "nvidia_driver_secure_boot_ok" in proc.stdout, proc.stdout[-3000:]
    assert "nvidia-open-580" not in ssh(nv_node, "dpkg-query -W -f '${Package}\\n' 'nvidia-*' 2>/dev/null; true")


def test_converge_installs_pinned_held_stack(nv_node, standin_repo):
    proc = play(nv_node, standin_repo, "nvidia-standins.yml")
    assert proc.returncode == 0, proc.stdout[-5000:]
    assert "GPU presence forced by nvidia_driver_force_gpu" in proc.stdout
    versions = dict(
        line.split() for line in ssh(nv_node, "dpkg-query -W -f '${Package} ${Version}\\n'").splitlines() if " " in line
    )
    # The branch's newest driver, fabricmanager at exactly its version, NCCL and CUDA at their pins
    # although newer packages are in the repository.
    assert versions["nvidia-open-580"] == "580.105.08-1"
    assert versions["nvidia-fabricmanager-580"] == versions["nvidia-open-580"]
    assert versions["libnccl2"] == versions["libnccl-dev"] == "2.27.3-1+cuda12.8"
    assert versions["cuda-toolkit-12-8"] == "12.8.1-1"
    assert versions["cudnn9-cuda-12"] == "9.10.2.21-1"
    held = set(ssh(nv_node, "apt-mark showhold").split())
    want = {
        "nvidia-open-580",
        "libnvidia-compute-580",
        "nvidia-fabricmanager-580",
        "cuda-toolkit-12-8",
        "cudnn9-cuda-12",
    }
    assert want | {"libnccl2", "libnccl-dev"} <= held
    upgrade = ssh(nv_node, "apt-get -s -o Debug::NoLocking=1 dist-upgrade")
    assert "Inst libnccl2" not in upgrade, upgrade
    source = ssh(nv_node, "cat /etc/apt/sources.list.d/cuda.sources")
    assert (
        f"URIs: {standin_repo.url}/" in source and "Signed-By: /usr/share/keyrings/cuda-archive-keyring.gpg" in source
    )
    assert not ssh(nv_node, "ls /etc/apt/sources.list.d/ | grep '\\.list$'; true").strip(), (
        "cuda-keyring's list file remains"
    )
    assert ssh(nv_node, "systemctl is-active nvidia-persistenced nvidia-fabricmanager").split() == ["active", "active"]
    assert "TEST DOUBLE GPU" in ssh(nv_node, "nvidia-smi -L")
    assert "/usr/local/cuda-12.8/bin" in ssh(nv_node, "bash -lc 'echo $PATH'")


def test_second_run_changes_nothing_and_check_mode_is_clean(nv_node, standin_repo):
    for args in ((), ("--check",)):
        proc = play(nv_node, standin_repo, "nvidia-standins.yml", *args)
        assert proc.returncode == 0, proc.stdout[-4000:]
        assert recap(proc.stdout)["node1"]["changed"] == 0, proc.stdout[-4000:]


def test_keyring_with_another_key_is_refused(nv_node, standin_repo):
    """NVIDIA's real fingerprint (the default) does not match the stand-in key: the role must refuse."""
    proc = play(
        nv_node,
        standin_repo,
        "nvidia-standins.yml",
        "-e",
        "nvidia_repo_key_fingerprint=EB693B3035CD5710E231E123A4B469963BF863CC",
    )
    assert proc.returncode != 0
    assert "refusing to trust it" in proc.stdout, proc.stdout[-3000:]


def test_reboot_handler_refuses_the_control_machine(nv_node, standin_repo):
    proc = subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible-playbook"),
            "-i",
            "localhost,",
            "-c",
            "local",
            "--check",
            str(HERE / "reboot-refusal.yml"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode != 0
    assert "refuses to reboot it" in proc.stdout, proc.stdout[-3000:]
    # A remote node is rebooted (in check mode: would be).
    remote = play(nv_node, standin_repo, "reboot-refusal.yml", "--check")
    assert remote.returncode == 0, remote.stdout[-3000:]
    assert "Reboot the node" in remote.stdout and "refuses" not in remote.stdout
