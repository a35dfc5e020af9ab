"""A PyTorch environment on the test cluster's nodes, as a site without Ansible sets one up.

python3-venv from Debian's packages, the wheelhouse on the node, `pip install --no-index --find-links`, and the
environment's python recorded in /etc/clustercheck/python (where the setup roles record it): `install` does it over
SSH on running nodes (idempotent: a node whose recorded python already imports torch is left alone), `node_image`
once into a node image that nodes then start from, as sites start machines from an image of their own. The session
fixture `torch_cluster` (tests/conftest.py) starts its nodes from that image; `install_packages` adds more packages
(Lightning) to that environment over SSH, and `remove_packages` takes them out again.
"""

from __future__ import annotations

import fcntl
import hashlib
import shlex
import subprocess
import threading
from pathlib import Path

import nodeimages
import paramiko

VENV = "/opt/clustercheck/venv"
PYTHON = f"{VENV}/bin/python"
REMOTE_WHEELS = "/var/cache/clustercheck-wheels"
LIGHTNING_PIN = "lightning==2.6.6"  # with its dependencies pinned in constraints.txt
TORCH_PIN = "torch==2.13.0"
# What `install` runs on a node, given its wheelhouse in REMOTE_WHEELS; `node_image` runs the same.
SETUP = (
    "command -v python3 >/dev/null && python3 -c 'import venv, ensurepip' 2>/dev/null || "
    "(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null)"
)
ENVIRONMENT = (
    f"python3 -m venv {VENV} && {VENV}/bin/pip install -q --no-index --find-links {REMOTE_WHEELS} {TORCH_PIN} && "
    f"mkdir -p /etc/clustercheck && echo {shlex.quote(PYTHON)} > /etc/clustercheck/python"
)


def ssh_client(cluster, node) -> paramiko.SSHClient:
    client = paramiko.SSHClient()
    client.load_host_keys(cluster.known_hosts)
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    client.connect(
        node.address, username="root", key_filename=cluster.key_file, timeout=10, allow_agent=False, look_for_keys=False
    )
    return client


def ssh_run(client: paramiko.SSHClient, command: str, timeout: float = 900) -> tuple[int, str]:
    _, stdout, stderr = client.exec_command(command, timeout=timeout)
    out = stdout.read().decode() + stderr.read().decode()
    return stdout.channel.recv_exit_status(), out


def _upload(client: paramiko.SSHClient, wheelhouse: Path) -> None:
    ssh_run(client, f"mkdir -p {REMOTE_WHEELS}")
    with client.open_sftp() as sftp:
        present = set(sftp.listdir(REMOTE_WHEELS))
        for wheel in sorted(wheelhouse.glob("*.whl")):
            if wheel.name not in present:
                sftp.put(str(wheel), f"{REMOTE_WHEELS}/{wheel.name}.part")
                sftp.rename(f"{REMOTE_WHEELS}/{wheel.name}.part", f"{REMOTE_WHEELS}/{wheel.name}")


def _install(cluster, node, wheelhouse: Path, errors: list[str]) -> None:
    try:
        with ssh_client(cluster, node) as client:
            ready, _ = ssh_run(
                client, f"test -x {PYTHON} && {PYTHON} -c 'import torch' && grep -qx {PYTHON} /etc/clustercheck/python"
            )
            if ready == 0:
                return
            status, out = ssh_run(client, SETUP)
            assert status == 0, f"apt-get install python3-venv: {out[-500:]}"
            _upload(client, wheelhouse)
            status, out = ssh_run(client, ENVIRONMENT)
            assert status == 0, f"pip install torch: {out[-500:]}"
    except Exception as exc:
        errors.append(f"{node.name}: {exc}")


def node_image(wheelhouse: Path, os_name: str = nodeimages.DEFAULT_OS) -> str:
    """The tag of OS's node image with the torch environment `install` makes (the wheelhouse in REMOTE_WHEELS too, as
    `install` leaves it), built once per node image and wheelhouse and kept for later sessions like the node images:
    SETUP and ENVIRONMENT run once in a container of the node image, which is then committed."""
    base = nodeimages.ensure_image(os_name)
    stamp = (wheelhouse / ".complete").read_text() if (wheelhouse / ".complete").exists() else ""
    recipe = hashlib.sha256(f"{base} {stamp} {SETUP} {ENVIRONMENT} {REMOTE_WHEELS}".encode()).hexdigest()[:12]
    tag = f"clustercheck-testnode-torch:{recipe}"
    if nodeimages.image_exists(tag):
        return tag
    images = nodeimages.CACHE_DIR / "images"
    images.mkdir(parents=True, exist_ok=True)
    with open(images / ".lock-torchnode", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one builder at a time across sessions
        if nodeimages.image_exists(tag):
            return tag
        builder = f"clustercheck-torchnode-{recipe}"
        nodeimages.docker("rm", "-f", builder, check=False)
        script = f"set -e; {SETUP}; mkdir -p {REMOTE_WHEELS}; cp /wheelhouse/*.whl {REMOTE_WHEELS}/; {ENVIRONMENT}; "
        script += "apt-get clean; rm -rf /var/lib/apt/lists/*_dists_*"  # as small as the node image it is made from
        nodeimages.log(f"building {tag}: {TORCH_PIN} in {VENV} on {base}")
        try:
            mount = f"{wheelhouse}:/wheelhouse:ro"
            nodeimages.docker("run", "--name", builder, "-v", mount, base, "sh", "-c", script, timeout=1800)
            nodeimages.docker("commit", "--change", 'CMD ["/sbin/init"]', builder, tag, timeout=900)
        except subprocess.TimeoutExpired as exc:
            raise nodeimages.ClusterError(f"building {tag} took longer than {exc.timeout:.0f} s") from exc
        finally:
            nodeimages.docker("rm", "-f", builder, check=False)
    return tag


def _install_packages(cluster, node, wheelhouse: Path, packages: list[str], errors: list[str]) -> None:
    try:
        with ssh_client(cluster, node) as client:
            _upload(client, wheelhouse)
            quoted = " ".join(map(shlex.quote, packages))
            status, out = ssh_run(client, f"{VENV}/bin/pip install -q --no-index --find-links {REMOTE_WHEELS} {quoted}")
            assert status == 0, f"pip install {quoted}: {out[-500:]}"
    except Exception as exc:
        errors.append(f"{node.name}: {exc}")


def _remove_packages(cluster, node, packages: list[str], errors: list[str]) -> None:
    try:
        with ssh_client(cluster, node) as client:
            quoted = " ".join(map(shlex.quote, packages))
            status, out = ssh_run(client, f"{VENV}/bin/pip uninstall -q -y {quoted}")
            assert status == 0, f"pip uninstall {quoted}: {out[-500:]}"
    except Exception as exc:
        errors.append(f"{node.name}: {exc}")


def install_packages(cluster, wheelhouse: Path, packages: list[str]) -> list[str]:
    """PACKAGES (pip requirements) into the torch environment of every node, from WHEELHOUSE (uploaded beside the
    torch wheels); the errors, one per node that failed."""
    return _each(cluster, _install_packages, wheelhouse, packages)


def remove_packages(cluster, packages: list[str]) -> list[str]:
    """PACKAGES out of the torch environment of every node again (their dependencies stay)."""
    return _each(cluster, _remove_packages, packages)


def install(cluster, wheelhouse: Path) -> list[str]:
    """Install on every node at once; the errors, one per node that failed."""
    return _each(cluster, _install, wheelhouse)


def _each(cluster, work, *args) -> list[str]:
    errors: list[str] = []
    threads = [threading.Thread(target=work, args=(cluster, n, *args, errors)) for n in cluster.nodes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return errors
