"""A real multi-node test cluster: Debian 12 and Ubuntu 20.04/22.04/24.04 nodes in Docker, reached over SSH.

Usage:
    testcluster up N [--name NAME] [--os OS[,OS...]] [--user USER]
                                       start N nodes (replacing leftovers of NAME)
    testcluster down [--name NAME]     remove the nodes, network and state of NAME
    testcluster inventory [--name NAME]  print the path of NAME's Ansible inventory
    testcluster image [--os OS]        build (or reuse) the node image only
    testcluster apt-cache              start (or find) the apt cache and print its URL

OS is debian12 (the default), ubuntu20.04, ubuntu22.04 or ubuntu24.04 (or the
suite names bookworm, focal, jammy, noble); one OS for every node, or one per
node. The node images (debootstrap from each distribution's own archive,
cached) and the apt cache are nodeimages.py's; this module starts, describes and
removes clusters of them. Each node runs systemd as
PID 1 with its own SSH host keys, generated at first start, and accepts key-only
login: as root, or with --user as that user (passwordless sudo; root then has
no key), the way cloud images are reached. The host keys are read through
`docker exec`, an out-of-band channel, and written to a known_hosts file, so
clients connect with host-key checking on from the first connection.

Ubuntu nodes fetch packages through an apt cache on this machine (apt-cacher-ng,
started when it is installed and not running), so clusters of the same release
do not download the same packages again; without apt-cacher-ng they use the
archive directly.

Docker is only the way to make and break nodes; tests reach nodes over SSH.
Standard library only, so the script runs before any virtual environment exists.
"""

from __future__ import annotations

import argparse
import ipaddress
import itertools
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from nodeimages import (  # the names callers reach through this module too
    CACHE_DIR,
    DEFAULT_OS,
    DISTROS,
    ClusterError,
    distro,
    docker,
    ensure_apt_cache,
    ensure_image,
    ensure_images,
    log,
    run,
)

LABEL = "io.clustercheck.testcluster"
DEFAULT_NAME = "cc"
STATE_DIR = Path(os.environ.get("TESTCLUSTER_STATE", CACHE_DIR / "clusters"))


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


# --------------------------------------------------------------------------- apt cache


@dataclass
class Node:
    name: str
    container: str
    address: str
    os: str = DEFAULT_OS


@dataclass
class Cluster:
    name: str
    network: str
    subnet: str
    image: str
    state_dir: str
    nodes: list[Node] = field(default_factory=list)
    # The login user (passwordless sudo) when not root; Ansible then connects as it with become.
    user: str = "root"
    # The apt proxy the Ubuntu nodes use (the control machine's apt-cacher-ng), or "".
    apt_proxy: str = ""
    # The data networks ("rails") besides the cluster network: each one's subnet; every node is on each, as eth1,
    # eth2... in order, and the inventory names them in cluster_rail_interfaces.
    rails: list[str] = field(default_factory=list)

    @property
    def rail_interfaces(self) -> list[str]:
        return [f"eth{i}" for i in range(1, len(self.rails) + 1)]

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

    def addresses(self, name: str) -> list[str]:
        """Every address of node NAME: its cluster address, then one on each rail (as `up` gives them)."""
        index = self.nodes.index(self.node(name)) + 1
        rails = [str(list(ipaddress.ip_network(subnet).hosts())[index + 9]) for subnet in self.rails]
        return [self.node(name).address, *rails]

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
        if not _remove_network(net):
            log(
                f'Docker refuses to remove the network {net} ("has active endpoints") though it lists no container '
                "on it: an endpoint dockerd keeps of a removed container (moby/moby#42119); left in place, the next "
                "cluster takes another name, and restarting dockerd removes it"
            )
    shutil.rmtree(STATE_DIR / name, ignore_errors=True)


def _remove_network(net: str, seconds: float = 30, unlisted: float = 10) -> bool:
    """docker network rm NET; True once it is gone. Again while Docker still lists endpoints of the containers just
    removed ("has active endpoints": after 64 containers went at once it did for minutes), those endpoints
    disconnected by force. False when it still refuses after SECONDS, or after UNLISTED seconds of listing no
    endpoint at all: an endpoint dockerd keeps of a removed container, which nothing but a restart of dockerd
    clears (moby/moby#42119), so waiting longer would only cost time."""
    started = time.monotonic()
    listed_at = started
    while docker("network", "rm", net, check=False).returncode != 0:
        if not _network_exists(net):  # removed meanwhile (another `down` of the same cluster)
            return True
        endpoints = docker(
            "network", "inspect", "--format", "{{range $id, $c := .Containers}}{{$c.Name}} {{end}}", net, check=False
        ).stdout.split()
        now = time.monotonic()
        if endpoints:
            listed_at = now
        if now - started >= seconds or now - listed_at >= unlisted:
            return False
        for endpoint in endpoints:
            docker("network", "disconnect", "--force", net, endpoint, check=False)
        time.sleep(1)
    return True


def _network_exists(net: str) -> bool:
    return docker("network", "inspect", "--format", "{{.Id}}", net, check=False).returncode == 0


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
    lines += ["", "[all:vars]", f"ansible_user={cluster.user}"]
    if cluster.user != "root":
        lines.append("ansible_become=true")
    lines += [
        "ansible_python_interpreter=/usr/bin/python3",
        f"ansible_ssh_private_key_file={cluster.key_file}",
        f"ansible_ssh_common_args='-o UserKnownHostsFile={cluster.known_hosts} -o StrictHostKeyChecking=yes'",
        f"cluster_cidr={cluster.subnet}",
    ]
    if cluster.rails:
        lines.append(f"cluster_rail_interfaces={json.dumps(cluster.rail_interfaces, separators=(',', ':'))}")
    lines.append("")
    Path(cluster.inventory).write_text("\n".join(lines))


def _node_setup_script(user: str, apt_proxy: str) -> str:
    """Shell run on a fresh node through `docker exec`: the login user's key and sudo, the apt proxy."""
    home = "/root" if user == "root" else f"/home/{user}"
    script = ["set -e"]
    if user != "root":
        script += [
            f"id -u {user} >/dev/null 2>&1 || useradd --create-home --shell /bin/bash --groups sudo {user}",
            f"echo '{user} ALL=(ALL) NOPASSWD:ALL' > /etc/sudoers.d/90-{user}",
            f"chmod 0440 /etc/sudoers.d/90-{user}",
            # A container may not lower RLIMIT_CORE, and sudo warns on every call where it tries.
            "grep -qs '^Set disable_coredump' /etc/sudo.conf || echo 'Set disable_coredump false' >> /etc/sudo.conf",
        ]
    script += [
        f"install -d -m 0700 -o {user} -g {user} {home}/.ssh",
        f"cat > {home}/.ssh/authorized_keys",
        f"chown {user}:{user} {home}/.ssh/authorized_keys && chmod 0600 {home}/.ssh/authorized_keys",
    ]
    if apt_proxy:
        script.append(f"echo 'Acquire::http::Proxy \"{apt_proxy}\";' > /etc/apt/apt.conf.d/01testcluster-proxy")
    return "\n".join(script)


def _network(network: str, name: str) -> tuple[str, ipaddress.IPv4Network]:
    """Create the bridge network NETWORK of cluster NAME on a free /24: its name and subnet. The name is NETWORK, or
    NETWORK-2, -3... where a network Docker refused to remove still holds it (`down`)."""
    names = itertools.chain([network], (f"{network}-{k}" for k in itertools.count(2)))
    network = next(n for n in names if not _network_exists(n))
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
            return network, subnet
        if attempt == 4:
            raise ClusterError(f"docker network create {network} failed: {created.stderr.strip()}")
        time.sleep(1)
    raise AssertionError("unreachable")


def _gateway(network: str, subnet: ipaddress.IPv4Network) -> str:
    out = docker("network", "inspect", "--format", "{{range .IPAM.Config}}{{.Gateway}}{{end}}", network).stdout
    return out.strip() or str(next(subnet.hosts()))


def up(
    count: int,
    name: str = DEFAULT_NAME,
    timeout: float = 180,
    os_name: str | list[str] = DEFAULT_OS,
    user: str = "root",
    image: str = "",
    rails: int = 0,
) -> Cluster:
    """Start COUNT nodes named node1..nodeN on a private network; replaces leftovers of NAME.

    OS_NAME: one OS for every node, or a list with one per node. USER: the login user; anyone but root gets
    passwordless sudo and root gets no key. IMAGE: an image made from OS_NAME's node image (one OS for every
    node) to start the nodes from instead, such as one with torch installed (tests/cluster/torchenv.py). RAILS:
    data networks besides the cluster network, each node on every one (eth1, eth2...; cluster_rail_interfaces).
    """
    if count < 1:
        raise ClusterError("a cluster needs at least one node")
    node_os = [os_name] * count if isinstance(os_name, str) else list(os_name)
    if len(node_os) != count:
        raise ClusterError(f"{count} node(s) but {len(node_os)} OS name(s): give one, or one per node")
    node_os = [distro(o).os for o in node_os]
    if not re.fullmatch(r"[a-z_][a-z0-9_-]{0,31}", user):
        raise ClusterError(f"{user!r} is not a valid user name")
    ensure_docker()
    images = ensure_images(node_os)
    if image:
        if len(set(node_os)) != 1:
            raise ClusterError("an image of its own is made from one OS's node image: give one OS for every node")
        images = {node_os[0]: image}
    port = ensure_apt_cache()
    down(name)
    state = STATE_DIR / name
    state.mkdir(parents=True, mode=0o700)
    run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"testcluster-{name}", "-f", str(state / "id_ed25519")])
    public_key = (state / "id_ed25519.pub").read_text().strip()

    network, subnet = _network(f"{name}-net", name)
    rail_nets = [_network(f"{name}-rail{k}", name) for k in range(1, rails + 1)]
    apt_proxy = f"http://{_gateway(network, subnet)}:{port}" if port else ""
    cluster = Cluster(
        name=name,
        network=network,
        subnet=str(subnet),
        image=images[node_os[0]],
        state_dir=str(state),
        user=user,
        apt_proxy=apt_proxy,
        rails=[str(sub) for _, sub in rail_nets],
    )
    hosts = list(subnet.hosts())
    for i in range(1, count + 1):
        node = Node(name=f"node{i}", container=f"{name}-node{i}", address=str(hosts[i + 9]), os=node_os[i - 1])
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
            images[node.os],
        )
        for rail, rail_subnet in rail_nets:  # eth1, eth2... in this order
            docker("network", "connect", "--ip", str(list(rail_subnet.hosts())[i + 9]), rail, node.container)
        cluster.nodes.append(node)
    cluster.save()

    deadline = time.monotonic() + timeout
    known_hosts = []
    for node in cluster.nodes:
        keys = _wait_for_host_keys(node, deadline)
        known_hosts += [f"{node.name},{node.address} {key}" for key in keys]
        setup = _node_setup_script(user, apt_proxy if distro(node.os).ubuntu else "")
        docker("exec", "-i", node.container, "sh", "-c", setup, input=public_key + "\n")
    Path(cluster.known_hosts).write_text("\n".join(known_hosts) + "\n")
    for node in cluster.nodes:
        _wait_for_sshd(node, deadline)
    _write_inventory(cluster)
    log(f"{count} node(s) up on {subnet} ({', '.join(node_os)}); inventory: {cluster.inventory}")
    return cluster


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="testcluster", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_up = sub.add_parser("up", help="start N nodes")
    p_up.add_argument("count", type=int)
    p_up.add_argument("--name", default=DEFAULT_NAME)
    p_up.add_argument("--os", default=DEFAULT_OS, help=f"OS of every node, or one per node: {', '.join(DISTROS)}")
    p_up.add_argument("--user", default="root", help="login user (passwordless sudo) instead of root")
    p_up.add_argument("--rails", type=int, default=0, help="data networks besides the cluster's, as eth1, eth2...")
    p_down = sub.add_parser("down", help="remove the cluster")
    p_down.add_argument("--name", default=DEFAULT_NAME)
    p_inv = sub.add_parser("inventory", help="print the inventory path")
    p_inv.add_argument("--name", default=DEFAULT_NAME)
    p_inv.add_argument("--cat", action="store_true", help="print the inventory itself")
    p_image = sub.add_parser("image", help="build or reuse the node image")
    p_image.add_argument("--os", default=DEFAULT_OS)
    sub.add_parser("apt-cache", help="start (or find) the apt cache and print its URL")
    args = parser.parse_args(argv)
    try:
        if args.command == "up":
            os_name = args.os.split(",") if "," in args.os else args.os
            print(up(args.count, args.name, os_name=os_name, user=args.user, rails=args.rails).inventory)
        elif args.command == "down":
            down(args.name)
        elif args.command == "inventory":
            cluster = Cluster.load(args.name)
            print(Path(cluster.inventory).read_text() if args.cat else cluster.inventory, end="" if args.cat else "\n")
        elif args.command == "image":
            ensure_docker()
            print(ensure_image(args.os))
        elif args.command == "apt-cache":
            port = ensure_apt_cache()
            if port is None:
                return 1
            print(f"http://127.0.0.1:{port}")
    except (ClusterError, subprocess.TimeoutExpired) as exc:
        log(f"error: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
