"""The NVIDIA roles (cuda_repo source) against a signed local repository of TEST DOUBLE packages.

No GPU and no access to NVIDIA's repository here: a one-node cluster of its own (so the shared
session cluster never sees stand-in drivers) gets the stand-in repository (tests/ansible/standins,
shapes and sources in SOURCES.md) over HTTP from the control machine, on its Docker network's
gateway address. The node's /sys is modelled in a directory the roles read instead
(nvidia_gpu_sysfs_root): an HGX B200-like board with GPUs, an NVSwitch and an NVLink-5 switch
management port, and, once the test "reboots" the node, the loaded module's version. Repository
setup, key check, package choice, pins, holds, the persistenced override and the services run for real.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import ipaddress
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from conftest import REPO, own_cluster
from test_site_playbook import changed_tasks, recap

sys.path.insert(0, str(Path(__file__).parent / "standins"))
import build_repo

pytestmark = pytest.mark.cluster
HERE = Path(__file__).resolve().parent
SB_VAR = "/root/SecureBoot-standin"
TOOLKIT_HOST = "nvidia-github.standin"  # the stand-in of nvidia.github.io, on the CUDA stand-in's address
SYSFS = "/root/sysfs-standin"
# PCI class codes as sysfs shows them: 0x0302 3D controller (an SXM GPU), 0x0680 bridge (NVSwitch);
# an NVLink-5 switch management port is an InfiniBand device whose VPD says SMDL=SW_MNG.
MODEL_SYSFS = f"""
set -e
mkdir -p {SYSFS}/bus/pci/devices {SYSFS}/class/infiniband/mlx5_0/device {SYSFS}/module
for i in 0 1; do
  d={SYSFS}/bus/pci/devices/0000:1$i:00.0; mkdir -p $d; echo 0x10de > $d/vendor; echo 0x030200 > $d/class
done
d={SYSFS}/bus/pci/devices/0000:05:00.0; mkdir -p $d; echo 0x10de > $d/vendor; echo 0x068000 > $d/class
d={SYSFS}/bus/pci/devices/0000:00:1f.0; mkdir -p $d; echo 0x8086 > $d/vendor; echo 0x060100 > $d/class
printf 'PN=stand-in\\nSMDL=SW_MNG\\n' > {SYSFS}/class/infiniband/mlx5_0/device/vpd
"""


@pytest.fixture(scope="module")
def nv_node():
    """A one-node cluster of its own with a modelled /sys, removed afterwards."""
    with own_cluster(1, "stand-in test node", suffix="-nv") as cluster:
        docker_sh(cluster, MODEL_SYSFS)
        yield cluster


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # apt's requests are not test output
        pass


@contextlib.contextmanager
def served(cluster, distro: str):
    """The stand-in repository, served on the node network's gateway (reachable from the nodes only);
    its url names DISTRO's repository, as nvidia_repo_url would."""
    repo = build_repo.build(Path(tempfile.mkdtemp(prefix="standin-repo-")))
    gateway = str(next(ipaddress.ip_network(cluster.subnet).hosts()))  # Docker's bridge address on the host
    handler = functools.partial(_QuietHandler, directory=str(repo.path))
    server = http.server.ThreadingHTTPServer((gateway, 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    repo.url = f"http://{gateway}:{port}/{distro}/x86_64"
    # NVIDIA serves the toolkit from another host (nvidia.github.io) than the CUDA repository: so does the stand-in,
    # under a name of its own for the same address (apt's origin pins tell repositories apart by host name).
    repo.served_at = f"http://{TOOLKIT_HOST}:{port}"
    docker_sh(cluster, f"grep -q ' {TOOLKIT_HOST}$' /etc/hosts || echo '{gateway} {TOOLKIT_HOST}' >> /etc/hosts")
    # Nodes that reach their distribution through the control machine's apt cache fetch these directly.
    direct = f'Acquire::http::Proxy::{gateway} "DIRECT";\nAcquire::http::Proxy::{TOOLKIT_HOST} "DIRECT";'
    docker_sh(cluster, f"printf '{direct}\\n' > /etc/apt/apt.conf.d/99clustercheck-standin")
    try:
        yield repo
    finally:
        server.shutdown()
        server.server_close()
        shutil.rmtree(repo.path, ignore_errors=True)


@pytest.fixture(scope="module")
def standin_repo(nv_node):
    with served(nv_node, "debian12") as repo:
        yield repo


def play(cluster, repo, playbook: str, *args: str) -> subprocess.CompletedProcess:
    cmd = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", cluster.inventory, str(HERE / playbook)]
    cmd += ["-e", f"nvidia_gpu_sysfs_root={SYSFS}"]
    cmd += ["-e", f"nvidia_repo_url={repo.url}", "-e", f"nvidia_repo_key_fingerprint={repo.fingerprint}"]
    cmd += ["-e", f"nvidia_repo_keyring_sha256={repo.keyring_sha256}"]
    # NVIDIA's Container Toolkit repository, served beside it with the same test key (containers role).
    cmd += ["-e", f"containers_toolkit_repo_url={repo.served_at}/{build_repo.TOOLKIT_DIR}"]
    cmd += ["-e", f"containers_toolkit_key_url={repo.served_at}/{build_repo.TOOLKIT_KEY}"]
    cmd += ["-e", f"containers_toolkit_key_fingerprint={repo.fingerprint}", *args]
    env = {**os.environ, "ANSIBLE_NOCOLOR": "1"}
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1800, env=env)


def docker_sh(cluster, script: str) -> None:
    subprocess.run(["docker", "exec", cluster.nodes[0].container, "sh", "-c", script], check=True)


def ssh(cluster, command: str) -> str:
    """COMMAND on the cluster's node, as root (through sudo when the cluster's login user is not root)."""
    node = cluster.nodes[0]
    options = [
        "-o",
        f"UserKnownHostsFile={cluster.known_hosts}",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "BatchMode=yes",
    ]
    remote = command if cluster.user == "root" else f"sudo sh -c {shlex.quote(command)}"
    proc = subprocess.run(
        ["ssh", "-i", cluster.key_file, *options, f"{cluster.user}@{node.address}", remote],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, f"{command}: {proc.stderr}"
    return proc.stdout


def installed(cluster) -> dict[str, str]:
    out = ssh(cluster, "dpkg-query -W -f '${Package} ${Version} ${db:Status-Abbrev}\\n'")
    return {p[0]: p[1] for p in (line.split() for line in out.splitlines()) if len(p) >= 3 and p[2][1:2] == "i"}


def unchanged(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert recap(proc.stdout)["node1"]["changed"] == 0, "\n".join(changed_tasks(proc.stdout))


def test_secure_boot_on_stops_the_driver_role(nv_node, standin_repo):
    # An EFI variable as the firmware writes it: 4 attribute bytes, then 1 (Secure Boot on).
    docker_sh(nv_node, f"printf '\\007\\000\\000\\000\\001' > {SB_VAR}")
    proc = play(nv_node, standin_repo, "nvidia-standins.yml", "-e", f"nvidia_driver_secure_boot_efivar={SB_VAR}")
    assert proc.returncode != 0
    assert "Secure Boot is on" in proc.stdout and "nvidia_driver_secure_boot_ok" in proc.stdout, proc.stdout[-3000:]
    assert "2 NVIDIA GPU(s), 1 NVSwitch(es) on the PCI bus, 1 NVLink-5 switch management port(s)" in proc.stdout
    assert "nvidia-open-580" not in installed(nv_node)


def test_converge_installs_the_stack_and_starts_no_gpu_service_before_the_reboot(nv_node, standin_repo):
    proc = play(nv_node, standin_repo, "nvidia-standins.yml")
    assert proc.returncode == 0, proc.stdout[-5000:]
    assert "node1 NEEDS A REBOOT: driver 580.105.08 is installed, the running nvidia module is none" in proc.stdout
    versions = installed(nv_node)
    # The branch's newest driver; fabric manager and NSCQ of its release although their revision differs
    # (580.105.08-1ubuntu1 vs -1); the real package, not the virtual nvidia-fabricmanager-580.
    assert versions["nvidia-open-580"] == versions["libnvidia-compute-580"] == "580.105.08-1ubuntu1"
    assert versions["nvidia-fabricmanager"] == versions["libnvidia-nscq"] == "580.105.08-1"
    assert "nvlsm" in versions  # the NVLink-5 switch port asks for the NVLink subnet manager
    # NCCL: no 2.27.7 build for CUDA 12.8, so the 12.4 build, and the choice is printed.
    assert versions["libnccl2"] == versions["libnccl-dev"] == "2.27.7-1+cuda12.4"
    assert "NCCL 2.27.7-1+cuda12.4 for CUDA 12.8" in proc.stdout
    assert versions["cuda-toolkit-12-8"] == "12.8.1-1" and versions["cudnn9-cuda-12"] == "9.10.2.21-1"
    held = set(ssh(nv_node, "apt-mark showhold").split())
    want = {"nvidia-open-580", "libnvidia-compute-580", "nvidia-utils-580", "nvidia-fabricmanager", "libnvidia-nscq"}
    assert want | {"nvlsm", "cuda-toolkit-12-8", "cudnn9-cuda-12", "libnccl2", "libnccl-dev"} <= held
    upgrade = ssh(nv_node, "apt-get -s -o Debug::NoLocking=1 dist-upgrade")
    assert "Inst libnccl2" not in upgrade and "Inst nvidia-fabricmanager" not in upgrade, upgrade
    source = ssh(nv_node, "cat /etc/apt/sources.list.d/cuda.sources")
    assert (
        f"URIs: {standin_repo.url}/" in source and "Signed-By: /usr/share/keyrings/cuda-archive-keyring.gpg" in source
    )
    assert not ssh(nv_node, "ls /etc/apt/sources.list.d/ | grep '\\.list$'; true").strip(), (
        "cuda-keyring's list remains"
    )
    # Nothing GPU-related started before the reboot; both come up at boot.
    states = ssh(nv_node, "systemctl is-active nvidia-persistenced nvidia-fabricmanager; true").split()
    assert states == ["inactive", "inactive"], states
    assert ssh(nv_node, "systemctl is-enabled nvidia-fabricmanager").strip() == "enabled"
    assert ssh(nv_node, "readlink /etc/systemd/system/multi-user.target.wants/nvidia-persistenced.service").strip()
    assert "ib_umad" in ssh(nv_node, "cat /etc/modules-load.d/clustercheck-nvlsm.conf")
    exec_start = ssh(nv_node, "systemctl show -p ExecStart --value nvidia-persistenced")
    assert "--persistence-mode" in exec_start and "--no-persistence-mode" not in exec_start, exec_start
    # The containers role: NVIDIA's Container Toolkit from its own repository at the pinned version and held, its
    # runtime registered with the distribution's Docker the way nvidia-ctk registers it, Docker's networks set.
    toolkit = (
        "nvidia-container-toolkit",
        "nvidia-container-toolkit-base",
        "libnvidia-container-tools",
        "libnvidia-container1",
    )
    assert {versions[p] for p in toolkit} == {"1.20.0-1"} and "docker.io" in versions
    assert set(toolkit) <= held
    toolkit_source = ssh(nv_node, "cat /etc/apt/sources.list.d/nvidia-container-toolkit.sources")
    assert f"URIs: {standin_repo.served_at}/{build_repo.TOOLKIT_DIR}/amd64/" in toolkit_source
    assert "Signed-By: /usr/share/keyrings/nvidia-container-toolkit-keyring.gpg" in toolkit_source
    daemon = json.loads(ssh(nv_node, "cat /etc/docker/daemon.json"))
    assert daemon == {
        "bip": "172.17.0.1/24",
        "default-address-pools": [{"base": "172.17.0.0/16", "size": 24}],
        "runtimes": {"nvidia": {"args": [], "path": "nvidia-container-runtime"}},
    }
    # No Docker daemon can run in this unprivileged node: installed, configured and masked, and said so.
    assert "node1 is a docker container: Docker is installed and configured, and masked there" in proc.stdout
    assert ssh(nv_node, "systemctl is-enabled docker.service docker.socket; true").split() == ["masked", "masked"]


def test_skipping_another_role_keeps_gpu_detection(nv_node, standin_repo):
    """Once, --skip-tags python_env skipped the detection the driver role needs:
    "'nvidia_driver_gpu_count' is undefined". Every role but the driver's is skipped: the driver role alone must find
    the GPUs (the other roles' check mode is proved after the reboot)."""
    skipped = "python_env,cuda_toolkit,nccl,containers"
    proc = play(nv_node, standin_repo, "nvidia-standins.yml", "--check", "--skip-tags", skipped)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert "installing the NVIDIA driver (branch 580, from cuda_repo)" in proc.stdout


@contextlib.contextmanager
def docker_daemon(config: Path):
    """A real dockerd (the control machine's) started with CONFIG as its daemon.json, in a network namespace of its
    own (its docker0 and iptables rules touch nothing of the machine's), its state in a directory of its own, removed
    afterwards; yields its docker command. The test nodes cannot run a Docker daemon, so this is where the role's
    configuration meets one. The directory's path is short: containerd's sockets live under it, and a Unix socket's
    path has at most 107 bytes."""
    root = Path(tempfile.mkdtemp(prefix="ccdockerd-"))
    sock, pid = root / "docker.sock", root / "docker.pid"
    dockerd = ["--config-file", str(config), "--data-root", str(root / "data"), "--exec-root", str(root / "exec")]
    dockerd += ["--pidfile", str(pid), "-H", f"unix://{sock}"]
    log = root / "dockerd.log"
    with log.open("w") as output:
        daemon = subprocess.Popen(
            ["unshare", "--net", "--fork", "sh", "-c", 'ip link set lo up && exec dockerd "$@"', "sh", *dockerd],
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    docker = ["docker", "-H", f"unix://{sock}"]
    try:
        for _ in range(120):
            if subprocess.run([*docker, "info"], capture_output=True).returncode == 0:
                break
            assert daemon.poll() is None, log.read_text()[-3000:]
            time.sleep(0.5)
        else:
            raise AssertionError(f"dockerd did not answer within 60 s: {log.read_text()[-3000:]}")
        yield docker
    finally:
        if pid.exists():
            subprocess.run(["kill", pid.read_text().strip()], check=False)
        daemon.wait(timeout=60)
        shutil.rmtree(root, ignore_errors=True)


def test_a_real_docker_daemon_takes_the_configuration_the_role_wrote(nv_node, standin_repo, tmp_path):
    """The node's /etc/docker/daemon.json, as the role left it, read by Docker itself: the NVIDIA runtime is
    registered, docker0 takes containers_bridge_ip, and a new network comes from the role's pool."""
    config = tmp_path / "daemon.json"
    config.write_text(ssh(nv_node, "cat /etc/docker/daemon.json"))
    with docker_daemon(config) as docker:
        runtimes = json.loads(subprocess.check_output([*docker, "info", "--format", "{{json .Runtimes}}"], text=True))
        assert runtimes["nvidia"] == {"path": "nvidia-container-runtime"}
        bridge = subprocess.check_output([*docker, "network", "inspect", "bridge", "--format", "{{json .IPAM.Config}}"])
        assert json.loads(bridge) == [{"Subnet": "172.17.0.0/24", "Gateway": "172.17.0.1"}]
        subprocess.run([*docker, "network", "create", "clustercheck-test"], check=True, capture_output=True)
        made = json.loads(
            subprocess.check_output(
                [*docker, "network", "inspect", "clustercheck-test", "--format", "{{json .IPAM.Config}}"]
            )
        )
        subnet = ipaddress.ip_network(made[0]["Subnet"])
        assert subnet.subnet_of(ipaddress.ip_network("172.17.0.0/16")) and subnet.prefixlen == 24, made


def test_second_run_before_the_reboot_changes_nothing(nv_node, standin_repo):
    proc = play(nv_node, standin_repo, "nvidia-standins.yml")
    unchanged(proc)
    assert "NEEDS A REBOOT" in proc.stdout


def test_after_the_reboot_the_gpu_services_run_with_persistence_mode(nv_node, standin_repo):
    # The reboot, as the roles can see it: the installed module is loaded, and ib_umad with it.
    docker_sh(
        nv_node,
        f"mkdir -p {SYSFS}/module/nvidia {SYSFS}/module/ib_umad && echo 580.105.08 > {SYSFS}/module/nvidia/version",
    )
    proc = play(nv_node, standin_repo, "nvidia-standins.yml")
    assert proc.returncode == 0, proc.stdout[-5000:]
    assert "NEEDS A REBOOT" not in proc.stdout and "TEST DOUBLE GPU" in proc.stdout
    assert ssh(nv_node, "systemctl is-active nvidia-persistenced nvidia-fabricmanager").split() == ["active", "active"]
    # The daemon runs with the packaged arguments, persistence mode switched on.
    args = ssh(nv_node, "cat /var/run/nvidia-persistenced/args").split()
    assert args == ["--user", "nvidia-persistenced", "--persistence-mode", "--verbose"], args
    unchanged(play(nv_node, standin_repo, "nvidia-standins.yml", "--check"))


def test_no_nccl_build_for_the_cuda_version_fails_with_the_list(nv_node, standin_repo):
    proc = play(nv_node, standin_repo, "nvidia-standins.yml", "--tags", "nccl", "-e", "nccl_cuda_version=12.3")
    assert proc.returncode != 0
    assert "no NCCL build of 2.27.7-1 for CUDA 12.3" in proc.stdout, proc.stdout[-3000:]
    assert "2.26.2-1+cuda12.8, 2.27.3-1+cuda12.4" in proc.stdout


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


def test_docker_networks_over_the_cluster_network_and_a_foreign_toolkit_key_are_refused(nv_node, standin_repo):
    pools = json.dumps({"containers_address_pools": [{"base": nv_node.subnet, "size": 26}]})
    overlap = play(nv_node, standin_repo, "nvidia-standins.yml", "--tags", "containers", "-e", pools)
    assert overlap.returncode != 0
    said = f"Docker's networks would overlap networks the node must reach ({nv_node.subnet} overlaps {nv_node.subnet})"
    assert said in overlap.stdout, overlap.stdout[-3000:]
    # NVIDIA's real key (the default) is not the stand-in's: the role must not trust what it downloaded.
    foreign = play(
        nv_node,
        standin_repo,
        "nvidia-standins.yml",
        "--tags",
        "containers",
        "-e",
        "containers_toolkit_key_fingerprint=C95B321B61E88C1809C4F759DDCAE044F796ECB0",
    )
    assert foreign.returncode != 0
    assert "refusing to trust it" in foreign.stdout, foreign.stdout[-3000:]


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


def test_the_reboot_handler_reboots_the_node_and_the_play_goes_on(nv_node, standin_repo):
    """The handler's reboot for real (the module's own shutdown command; the node, a container, starts again as Docker
    restarts it), through the strategy site.yml runs with (ansible.cfg: Mitogen's), and the next task runs on the
    rebooted node. Last in this module: the node's services start afresh."""
    subprocess.run(["docker", "update", "--restart", "always", nv_node.nodes[0].container], check=True)
    proc = play(nv_node, standin_repo, "reboot-node.yml")
    assert proc.returncode == 0, proc.stdout[-4000:]
    said = re.search(r"rebooted=(\w+) before=(\d+) after=(\d+)", proc.stdout)
    assert said, proc.stdout[-4000:]
    assert said[1] == "True" and int(said[3]) > int(said[2]), said[0]
