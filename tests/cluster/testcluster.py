"""A real multi-node test cluster: Debian 12 nodes in Docker, reached over SSH.

Usage:
    testcluster up N [--name NAME]     start N nodes (replacing leftovers of NAME)
    testcluster down [--name NAME]     remove the nodes, network and state of NAME
    testcluster inventory [--name NAME]  print the path of NAME's Ansible inventory
    testcluster image                  build (or reuse) the node image only

The node image is built with debootstrap from Debian's packages and imported
into Docker; it is cached (as an image, and as a root-file-system tarball so a
wiped Docker data directory costs an import, not a rebuild). Each node runs
systemd as PID 1 with its own SSH host keys, generated at first start, and
accepts key-only root login. The host keys are read through `docker exec`, an
out-of-band channel, and written to a known_hosts file, so clients connect with
host-key checking on from the first connection.

Docker is only the way to make and break nodes; tests reach nodes over SSH.
Standard library only, so the script runs before any virtual environment exists.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import ipaddress
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

LABEL = "io.clustercheck.testcluster"
DEFAULT_NAME = "cc"
SUITE = "bookworm"
MIRROR = os.environ.get("TESTCLUSTER_MIRROR", "http://deb.debian.org/debian")
SECURITY_MIRROR = os.environ.get("TESTCLUSTER_SECURITY_MIRROR", "http://deb.debian.org/debian-security")
CACHE_DIR = Path(os.environ.get("TESTCLUSTER_CACHE", Path.home() / ".cache" / "clustercheck-testcluster"))
STATE_DIR = Path(os.environ.get("TESTCLUSTER_STATE", CACHE_DIR / "clusters"))

# What a bare Ubuntu server has that the product relies on being there:
# systemd, sshd, Python for Ansible, apt bindings for Ansible's apt module.
PACKAGES = [
    "systemd",
    "systemd-sysv",
    "dbus",
    "openssh-server",
    "python3",
    "python3-apt",
    "sudo",
    "iproute2",
    "iputils-ping",
    "procps",
    "ca-certificates",
    "gnupg",
    "curl",
    "less",
    "kmod",
]

# Units that make no sense in a container and only fail there.
MASKED_UNITS = [
    "getty@tty1.service",
    "console-getty.service",
    "systemd-udevd.service",
    "systemd-udevd-control.socket",
    "systemd-udevd-kernel.socket",
    "systemd-modules-load.service",
    "systemd-remount-fs.service",
    "sys-kernel-config.mount",
    "sys-kernel-debug.mount",
    "sys-kernel-tracing.mount",
    "sys-fs-fuse-connections.mount",
]

HOSTKEY_UNIT = """\
[Unit]
Description=Generate this node's own SSH host keys at first start
Before=ssh.service
ConditionPathExists=!/etc/ssh/ssh_host_ed25519_key

[Service]
Type=oneshot
ExecStart=/usr/bin/ssh-keygen -A

[Install]
WantedBy=multi-user.target
"""

SSHD_CONFIG = """\
# Key-only login, as on a hardened server.
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
UseDNS no
"""

SOURCES = f"""\
Types: deb
URIs: {MIRROR}
Suites: {SUITE} {SUITE}-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: {SECURITY_MIRROR}
Suites: {SUITE}-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
"""


class ClusterError(RuntimeError):
    """A failure the user can act on; printed as one line."""


def log(msg: str) -> None:
    print(f"testcluster: {msg}", file=sys.stderr, flush=True)


def run(
    cmd: list[str], *, check: bool = True, capture: bool = True, input: str | None = None, timeout: float | None = 600
) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        cmd,
        check=False,
        text=True,
        input=input,
        timeout=timeout,
        stdout=subprocess.PIPE if capture else None,
        stderr=subprocess.PIPE if capture else None,
    )
    if check and proc.returncode != 0:
        detail = (proc.stderr or proc.stdout or "").strip().splitlines()[-1:] if capture else []
        raise ClusterError(f"{' '.join(cmd[:3])} failed (exit {proc.returncode}): {' '.join(detail)}")
    return proc


def docker(*args: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
    return run(["docker", *args], check=check, **kw)


# --------------------------------------------------------------------------- docker engine


def docker_answers() -> bool:
    if not shutil.which("docker"):
        return False
    try:
        return run(["docker", "info", "--format", "{{.ServerVersion}}"], check=False, timeout=20).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def ensure_docker(start: bool = True) -> None:
    """Make sure a Docker engine answers; start dockerd when none does (a stopped one is a leftover)."""
    if docker_answers():
        return
    if not start or not shutil.which("dockerd"):
        raise ClusterError("no Docker engine answers and dockerd is not installed (apt-get install docker.io)")
    if os.geteuid() != 0:
        raise ClusterError("no Docker engine answers; start dockerd (as root) and try again")
    # A dockerd that died leaves its pid file behind and refuses to start again.
    for stale in ("/var/run/docker.pid", "/run/docker.pid"):
        pid_path = Path(stale)
        if pid_path.exists():
            try:
                os.kill(int(pid_path.read_text().strip() or 0), 0)
            except (ValueError, ProcessLookupError, PermissionError):
                pid_path.unlink(missing_ok=True)
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    log_file = open(CACHE_DIR / "dockerd.log", "ab")  # noqa: SIM115 - handed to the daemon
    log("starting dockerd")
    subprocess.Popen(["dockerd"], stdout=log_file, stderr=log_file, stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if docker_answers():
            return
        time.sleep(1)
    raise ClusterError(f"dockerd did not answer within 90 s; see {CACHE_DIR / 'dockerd.log'}")


# --------------------------------------------------------------------------- image


def recipe_hash() -> str:
    recipe = json.dumps([SUITE, MIRROR, SECURITY_MIRROR, PACKAGES, MASKED_UNITS, HOSTKEY_UNIT, SSHD_CONFIG, SOURCES, 3])
    return hashlib.sha256(recipe.encode()).hexdigest()[:12]


def image_tag() -> str:
    return f"clustercheck-testnode:{SUITE}-{recipe_hash()}"


def image_exists(tag: str) -> bool:
    return docker("image", "inspect", tag, check=False).returncode == 0


def build_rootfs(tarball: Path) -> None:
    if not shutil.which("debootstrap"):
        raise ClusterError("debootstrap is not installed (apt-get install debootstrap)")
    workdir = Path(tempfile.mkdtemp(prefix="testnode-", dir=tarball.parent))
    root = workdir / "rootfs"
    try:
        log(f"debootstrap {SUITE} from {MIRROR} (a few minutes, once)")
        run(
            ["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE, str(root), MIRROR],
            timeout=1800,
        )
        (root / "etc/apt/sources.list").unlink(missing_ok=True)
        (root / "etc/apt/sources.list.d/debian.sources").write_text(SOURCES)
        # Each node makes its own host keys and machine id at first start.
        for key in (root / "etc/ssh").glob("ssh_host_*"):
            key.unlink()
        (root / "etc/machine-id").write_text("")
        (root / "var/lib/dbus/machine-id").unlink(missing_ok=True)
        (root / "etc/systemd/system/ssh-hostkeys.service").write_text(HOSTKEY_UNIT)
        wants = root / "etc/systemd/system/multi-user.target.wants"
        wants.mkdir(parents=True, exist_ok=True)
        (wants / "ssh-hostkeys.service").symlink_to("/etc/systemd/system/ssh-hostkeys.service")
        (root / "etc/ssh/sshd_config.d/10-testcluster.conf").write_text(SSHD_CONFIG)
        for unit in MASKED_UNITS:
            target = root / "etc/systemd/system" / unit
            target.unlink(missing_ok=True)
            target.symlink_to("/dev/null")
        ssh_dir = root / "root/.ssh"
        ssh_dir.mkdir(mode=0o700, exist_ok=True)
        # Keep the image small: package lists and the apt cache are refetched on the node.
        shutil.rmtree(root / "var/cache/apt/archives", ignore_errors=True)
        (root / "var/cache/apt/archives/partial").mkdir(parents=True, exist_ok=True)
        for lists in (root / "var/lib/apt/lists").glob("*_dists_*"):
            lists.unlink()
        partial = tarball.with_suffix(".partial")
        run(["tar", "-C", str(root), "--numeric-owner", "-cf", str(partial), "."], timeout=900)
        partial.rename(tarball)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def ensure_image() -> str:
    """Return the tag of the node image, building and importing it only when it is missing."""
    tag = image_tag()
    if image_exists(tag):
        return tag
    images = CACHE_DIR / "images"
    images.mkdir(parents=True, exist_ok=True)
    with open(images / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one builder at a time
        if image_exists(tag):
            return tag
        tarball = images / f"{tag.replace(':', '_')}.tar"
        if not tarball.exists():
            build_rootfs(tarball)
        log(f"importing {tag}")
        docker(
            "import",
            "--change",
            'CMD ["/sbin/init"]',
            "--change",
            "ENV container=docker",
            str(tarball),
            tag,
            timeout=900,
        )
    return tag


# --------------------------------------------------------------------------- cluster


@dataclass
class Node:
    name: str
    container: str
    address: str


@dataclass
class Cluster:
    name: str
    network: str
    subnet: str
    image: str
    state_dir: str
    nodes: list[Node] = field(default_factory=list)

    @property
    def key_file(self) -> str:
        return str(Path(self.state_dir) / "id_ed25519")

    @property
    def known_hosts(self) -> str:
        return str(Path(self.state_dir) / "known_hosts")

    @property
    def inventory(self) -> str:
        return str(Path(self.state_dir) / "inventory.ini")

    def node(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)

    def save(self) -> None:
        (Path(self.state_dir) / "cluster.json").write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, name: str = DEFAULT_NAME) -> Cluster:
        path = STATE_DIR / name / "cluster.json"
        if not path.exists():
            raise ClusterError(f"no test cluster named {name!r} is up (testcluster up N)")
        data = json.loads(path.read_text())
        data["nodes"] = [Node(**n) for n in data["nodes"]]
        return cls(**data)


def _resources(name: str) -> tuple[list[str], list[str]]:
    selector = f"label={LABEL}={name}"
    containers = docker("ps", "-aq", "--filter", selector).stdout.split()
    networks = docker("network", "ls", "-q", "--filter", selector).stdout.split()
    return containers, networks


def down(name: str = DEFAULT_NAME) -> None:
    """Remove every container and network of cluster NAME, and its state; tolerant of partial leftovers."""
    ensure_docker()
    containers, networks = _resources(name)
    if containers:
        docker("rm", "-f", "-v", *containers, timeout=120)
    for net in networks:
        docker("network", "rm", net, check=False)
    shutil.rmtree(STATE_DIR / name, ignore_errors=True)


def _free_subnet() -> ipaddress.IPv4Network:
    """A /24 for the cluster network that no Docker network or host route uses."""
    used: list[ipaddress.IPv4Network] = []
    for net_id in docker("network", "ls", "-q").stdout.split():
        out = docker(
            "network", "inspect", "--format", "{{range .IPAM.Config}}{{.Subnet}} {{end}}", net_id, check=False
        ).stdout
        used += [ipaddress.ip_network(s, strict=False) for s in out.split() if "." in s]
    routes = run(["ip", "-4", "route", "show"], check=False).stdout if shutil.which("ip") else ""
    for line in routes.splitlines():
        dest = line.split()[0] if line else ""
        if "/" in dest:
            used.append(ipaddress.ip_network(dest, strict=False))
    for third in range(80, 250):
        candidate = ipaddress.ip_network(f"172.30.{third}.0/24")
        if not any(candidate.overlaps(u) for u in used):
            return candidate
    raise ClusterError("no free 172.30.x.0/24 subnet for the test network")


def _wait_for_host_keys(node: Node, deadline: float) -> list[str]:
    while time.monotonic() < deadline:
        proc = docker(
            "exec",
            node.container,
            "sh",
            "-c",
            "cat /etc/ssh/ssh_host_ed25519_key.pub /etc/ssh/ssh_host_ecdsa_key.pub "
            "/etc/ssh/ssh_host_rsa_key.pub 2>/dev/null",
            check=False,
        )
        keys = [line.split()[:2] for line in proc.stdout.splitlines() if line.strip()]
        if len(keys) == 3:
            return [" ".join(k) for k in keys]
        time.sleep(0.5)
    raise ClusterError(f"{node.name}: no SSH host keys within the start timeout")


def _wait_for_sshd(node: Node, deadline: float) -> None:
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((node.address, 22), timeout=2) as sock:
                if sock.recv(64).startswith(b"SSH-"):
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise ClusterError(f"{node.name}: sshd did not answer on {node.address}:22")


def _write_inventory(cluster: Cluster) -> None:
    lines = ["# Written by tests/cluster/testcluster for the test cluster; do not edit.", "[gpu_nodes]"]
    lines += [f"{n.name} ansible_host={n.address}" for n in cluster.nodes]
    lines += [
        "",
        "[all:vars]",
        "ansible_user=root",
        "ansible_python_interpreter=/usr/bin/python3",
        f"ansible_ssh_private_key_file={cluster.key_file}",
        f"ansible_ssh_common_args='-o UserKnownHostsFile={cluster.known_hosts} -o StrictHostKeyChecking=yes'",
        f"cluster_cidr={cluster.subnet}",
        "",
    ]
    Path(cluster.inventory).write_text("\n".join(lines))


def up(count: int, name: str = DEFAULT_NAME, timeout: float = 180) -> Cluster:
    """Start COUNT nodes named node1..nodeN on a private network; replaces leftovers of NAME."""
    if count < 1:
        raise ClusterError("a cluster needs at least one node")
    ensure_docker()
    image = ensure_image()
    down(name)
    state = STATE_DIR / name
    state.mkdir(parents=True, mode=0o700)
    run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"testcluster-{name}", "-f", str(state / "id_ed25519")])
    public_key = (state / "id_ed25519.pub").read_text().strip()

    network = f"{name}-net"
    for attempt in range(5):  # another cluster may take the same subnet between our look and our create
        subnet = _free_subnet()
        created = docker(
            "network",
            "create",
            "--driver",
            "bridge",
            "--subnet",
            str(subnet),
            "--label",
            f"{LABEL}={name}",
            network,
            check=False,
        )
        if created.returncode == 0:
            break
        if attempt == 4:
            raise ClusterError(f"docker network create {network} failed: {created.stderr.strip()}")
        time.sleep(1)
    cluster = Cluster(name=name, network=network, subnet=str(subnet), image=image, state_dir=str(state))
    hosts = list(subnet.hosts())
    for i in range(1, count + 1):
        node = Node(name=f"node{i}", container=f"{name}-node{i}", address=str(hosts[i + 9]))
        docker(
            "run",
            "-d",
            "--name",
            node.container,
            "--hostname",
            node.name,
            "--label",
            f"{LABEL}={name}",
            "--network",
            network,
            "--ip",
            node.address,
            "--cap-add",
            "NET_ADMIN",
            "--stop-signal",
            "SIGRTMIN+3",
            "--tmpfs",
            "/run",
            "--tmpfs",
            "/run/lock",
            "-v",
            "/sys/fs/cgroup:/sys/fs/cgroup:ro",
            "--shm-size",
            "1g",
            image,
        )
        cluster.nodes.append(node)
    cluster.save()

    deadline = time.monotonic() + timeout
    known_hosts = []
    for node in cluster.nodes:
        keys = _wait_for_host_keys(node, deadline)
        known_hosts += [f"{node.name},{node.address} {key}" for key in keys]
        docker(
            "exec",
            "-i",
            node.container,
            "sh",
            "-c",
            "umask 077 && mkdir -p /root/.ssh && cat > /root/.ssh/authorized_keys",
            input=public_key + "\n",
        )
    Path(cluster.known_hosts).write_text("\n".join(known_hosts) + "\n")
    for node in cluster.nodes:
        _wait_for_sshd(node, deadline)
    _write_inventory(cluster)
    log(f"{count} node(s) up on {subnet}; inventory: {cluster.inventory}")
    return cluster


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="testcluster", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_up = sub.add_parser("up", help="start N nodes")
    p_up.add_argument("count", type=int)
    p_up.add_argument("--name", default=DEFAULT_NAME)
    p_down = sub.add_parser("down", help="remove the cluster")
    p_down.add_argument("--name", default=DEFAULT_NAME)
    p_inv = sub.add_parser("inventory", help="print the inventory path")
    p_inv.add_argument("--name", default=DEFAULT_NAME)
    p_inv.add_argument("--cat", action="store_true", help="print the inventory itself")
    sub.add_parser("image", help="build or reuse the node image")
    args = parser.parse_args(argv)
    try:
        if args.command == "up":
            print(up(args.count, args.name).inventory)
        elif args.command == "down":
            down(args.name)
        elif args.command == "inventory":
            cluster = Cluster.load(args.name)
            print(Path(cluster.inventory).read_text() if args.cat else cluster.inventory, end="" if args.cat else "\n")
        elif args.command == "image":
            ensure_docker()
            print(ensure_image())
    except (ClusterError, subprocess.TimeoutExpired) as exc:
        log(f"error: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
