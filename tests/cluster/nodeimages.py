"""The test cluster's node images: Debian 12 and Ubuntu 20.04/22.04/24.04 root file systems built with
debootstrap from each distribution's own archive and imported into Docker, and the apt cache the Ubuntu nodes
fetch their packages through.

Each image is cached (as a Docker image, and as a root-file-system tarball so a wiped Docker data directory costs an
import, not a rebuild). The Ubuntu archive key is taken from Ubuntu's ubuntu-keyring package and trusted only after
its fingerprint is checked. An image holds what a bare server has that the product relies on (systemd, sshd, Python
for Ansible); each node makes its own SSH host keys and machine id at first start. The cluster's lifecycle (start,
stop, inventory) is testcluster.py's; this module only makes the images it starts.

Standard library only, so it runs before any virtual environment exists.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

DEFAULT_OS = "debian12"
SUITE = "bookworm"
MIRROR = os.environ.get("TESTCLUSTER_MIRROR", "http://deb.debian.org/debian")
SECURITY_MIRROR = os.environ.get("TESTCLUSTER_SECURITY_MIRROR", "http://deb.debian.org/debian-security")
UBUNTU_MIRROR = os.environ.get("TESTCLUSTER_UBUNTU_MIRROR", "http://archive.ubuntu.com/ubuntu")
CACHE_DIR = Path(os.environ.get("TESTCLUSTER_CACHE", Path.home() / ".cache" / "clustercheck-testcluster"))

# Ubuntu's archive keyring comes from its ubuntu-keyring package (the noble release's build, a file
# that never changes in the pool); only the key with this fingerprint is trusted: "Ubuntu Archive
# Automatic Signing Key (2018)", which signs the Release files of every supported suite.
UBUNTU_KEYRING_DEB = "pool/main/u/ubuntu-keyring/ubuntu-keyring_2023.11.28.1_all.deb"
UBUNTU_ARCHIVE_KEY = "F6ECB3762474EDA9D21B7022871920D1991BC93C"
# apt-cacher-ng on this machine, as the nodes' apt proxy (its Debian package's default port).
APT_CACHE_PORT = int(os.environ.get("TESTCLUSTER_APT_CACHE_PORT", "3142"))
# What a bare Ubuntu server has that the product relies on being there: systemd, sshd, Python for Ansible. No apt
# bindings (python3-apt): minimal images lack them, and site.yml's preflight installs them (playbooks/tasks/
# apt_bindings.yml); a node built with them would hide that first failure.
PACKAGES = [
    "systemd",
    "systemd-sysv",
    "dbus",
    "openssh-server",
    "python3",
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


def _ubuntu_sources_list(suite: str) -> str:
    """/etc/apt/sources.list as Ubuntu 20.04 and 22.04 server images ship it (one-line format)."""
    return "".join(
        f"deb {UBUNTU_MIRROR} {pocket} main restricted universe\n"
        for pocket in (suite, f"{suite}-updates", f"{suite}-security")
    )


def _ubuntu_sources_deb822(suite: str) -> str:
    """/etc/apt/sources.list.d/ubuntu.sources as Ubuntu 24.04 images ship it (deb822)."""
    return (
        f"Types: deb\nURIs: {UBUNTU_MIRROR}\nSuites: {suite} {suite}-updates {suite}-security\n"
        "Components: main restricted universe\nSigned-By: /usr/share/keyrings/ubuntu-archive-keyring.gpg\n"
    )


@dataclass(frozen=True)
class Distro:
    """How to build a node image of one distribution release."""

    os: str  # the name `up --os` takes
    suite: str
    mirror: str
    sources_path: str  # relative to the root file system
    sources: str
    ubuntu: bool = False
    # debootstrap has no script for newer Ubuntu suites: they all use the gutsy script.
    script: str = ""
    aliases: tuple[str, ...] = ()


DISTROS = {
    d.os: d
    for d in (
        Distro("debian12", SUITE, MIRROR, "etc/apt/sources.list.d/debian.sources", SOURCES, aliases=("bookworm",)),
        *(
            Distro(
                f"ubuntu{version}",
                suite,
                UBUNTU_MIRROR,
                "etc/apt/sources.list.d/ubuntu.sources" if deb822 else "etc/apt/sources.list",
                _ubuntu_sources_deb822(suite) if deb822 else _ubuntu_sources_list(suite),
                ubuntu=True,
                script="gutsy",
                aliases=(suite, version),
            )
            # 24.04 ships its sources in deb822 form, the earlier releases in sources.list
            for version, suite, deb822 in (
                ("20.04", "focal", False),
                ("22.04", "jammy", False),
                ("24.04", "noble", True),
            )
        ),
    )
}


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


# --------------------------------------------------------------------------- apt cache


def _apt_cache_answers() -> bool:
    try:
        with socket.create_connection(("127.0.0.1", APT_CACHE_PORT), timeout=2) as sock:
            sock.sendall(b"GET /acng-report.html HTTP/1.0\r\n\r\n")
            return sock.recv(16).startswith(b"HTTP/")
    except OSError:
        return False


def ensure_apt_cache() -> int | None:
    """The port of apt-cacher-ng on this machine, started when installed and not running; None without it.

    Its cache lives beside the images, so it survives between test sessions like they do.
    """
    if _apt_cache_answers():
        return APT_CACHE_PORT
    binary = shutil.which("apt-cacher-ng") or shutil.which("apt-cacher-ng", path="/usr/sbin:/usr/local/sbin")
    if not binary:
        log("apt-cacher-ng is not installed (apt-get install apt-cacher-ng): nodes fetch packages directly")
        return None
    home = CACHE_DIR / "apt-cacher-ng"
    for sub in ("cache", "log"):
        (home / sub).mkdir(parents=True, exist_ok=True)
    with open(home / ".start-lock", "w") as lock:
        # One starter at a time: daemons started side by side on one port all fail to answer.
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _apt_cache_answers():
            return APT_CACHE_PORT
        log(f"starting apt-cacher-ng on port {APT_CACHE_PORT} (cache: {home / 'cache'})")
        subprocess.Popen(
            [
                binary,
                "-c",
                "/etc/apt-cacher-ng",
                "ForeGround=1",
                f"Port={APT_CACHE_PORT}",
                f"CacheDir={home / 'cache'}",
                f"LogDir={home / 'log'}",
                f"PidFile={home / 'pid'}",
                f"SocketPath={home / 'socket'}",
            ],
            stdout=open(home / "log" / "daemon.log", "ab"),  # noqa: SIM115 - handed to the daemon
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if _apt_cache_answers():
                return APT_CACHE_PORT
            time.sleep(0.5)
        raise ClusterError(f"apt-cacher-ng did not answer on port {APT_CACHE_PORT}; see {home / 'log'}")


# --------------------------------------------------------------------------- image


def distro(os_name: str) -> Distro:
    """The Distro for an OS name or suite (`ubuntu22.04`, `jammy`, `22.04`, `debian12`, `bookworm`)."""
    for d in DISTROS.values():
        if os_name == d.os or os_name in d.aliases:
            return d
    raise ClusterError(f"unknown OS {os_name!r}; choose from {', '.join(DISTROS)}")


def recipe_hash(d: Distro | None = None) -> str:
    d = d or DISTROS[DEFAULT_OS]
    if d.ubuntu:
        recipe = [d.suite, d.mirror, d.sources_path, d.sources, UBUNTU_ARCHIVE_KEY, d.script]
        recipe += [PACKAGES, MASKED_UNITS, HOSTKEY_UNIT, SSHD_CONFIG, 1]
    else:  # unchanged since Debian was the only OS, so cached Debian images stay valid
        recipe = [SUITE, MIRROR, SECURITY_MIRROR, PACKAGES, MASKED_UNITS, HOSTKEY_UNIT, SSHD_CONFIG, SOURCES, 3]
    return hashlib.sha256(json.dumps(recipe).encode()).hexdigest()[:12]


def image_tag(d: Distro | None = None) -> str:
    d = d or DISTROS[DEFAULT_OS]
    return f"clustercheck-testnode:{d.suite}-{recipe_hash(d)}"


def image_exists(tag: str) -> bool:
    return docker("image", "inspect", tag, check=False).returncode == 0


def fingerprints(keyring: Path) -> list[str]:
    """The primary-key fingerprints in an OpenPGP keyring file, read without importing it anywhere.

    gpg gets a home directory of its own: builders running side by side would otherwise race to create ~/.gnupg.
    """
    with tempfile.TemporaryDirectory(prefix="gnupg-") as home:
        out = run(["gpg", "--batch", "--homedir", home, "--with-colons", "--show-keys", str(keyring)]).stdout
    found, primary = [], False
    for line in out.splitlines():
        fields = line.split(":")
        if fields[0] == "pub":
            primary = True
        elif fields[0] == "sub":
            primary = False
        elif fields[0] == "fpr" and primary:
            found.append(fields[9])
            primary = False
    return found


def ubuntu_keyring() -> Path:
    """A keyring holding only Ubuntu's archive signing key, taken from ubuntu-keyring after its fingerprint is
    checked; cached."""
    trusted = CACHE_DIR / "keyrings" / f"ubuntu-archive-{UBUNTU_ARCHIVE_KEY[-16:]}.gpg"
    if trusted.exists():
        return trusted
    trusted.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ubuntu-keyring-", dir=trusted.parent) as tmp:
        work = Path(tmp)
        deb = work / "ubuntu-keyring.deb"
        log(f"fetching {UBUNTU_MIRROR}/{UBUNTU_KEYRING_DEB}")
        run(["curl", "-fsSL", "--retry", "3", "-o", str(deb), f"{UBUNTU_MIRROR}/{UBUNTU_KEYRING_DEB}"], timeout=120)
        run(["dpkg-deb", "-x", str(deb), str(work / "root")])
        keyring = work / "root/usr/share/keyrings/ubuntu-archive-keyring.gpg"
        if not keyring.exists() or UBUNTU_ARCHIVE_KEY not in fingerprints(keyring):
            raise ClusterError(f"ubuntu-keyring lacks the Ubuntu archive key {UBUNTU_ARCHIVE_KEY}; not trusting it")
        home = work / "gnupg"
        home.mkdir(mode=0o700)
        gpg = ["gpg", "--batch", "--quiet", "--homedir", str(home)]
        run([*gpg, "--import", str(keyring)])
        run([*gpg, "--export", "--output", str(work / "trusted.gpg"), UBUNTU_ARCHIVE_KEY])
        if fingerprints(work / "trusted.gpg") != [UBUNTU_ARCHIVE_KEY]:
            raise ClusterError("exporting the Ubuntu archive key gave an unexpected keyring")
        (work / "trusted.gpg").rename(trusted)
    return trusted


def build_rootfs(tarball: Path, d: Distro | None = None) -> None:
    d = d or DISTROS[DEFAULT_OS]
    if not shutil.which("debootstrap"):
        raise ClusterError("debootstrap is not installed (apt-get install debootstrap)")
    cmd = ["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}"]
    env = dict(os.environ)
    if d.ubuntu:
        cmd.append(f"--keyring={ubuntu_keyring()}")
        port = ensure_apt_cache()
        if port:  # debootstrap downloads with wget, which honours http_proxy
            env["http_proxy"] = f"http://127.0.0.1:{port}/"
    # Made once nothing before the build can fail, so a failure leaves no work directory behind.
    workdir = Path(tempfile.mkdtemp(prefix=f"testnode-{d.suite}-", dir=tarball.parent))
    root = workdir / "rootfs"
    cmd += [d.suite, str(root), d.mirror]
    if d.script:
        cmd.append(f"/usr/share/debootstrap/scripts/{d.script}")
    try:
        log(f"debootstrap {d.suite} from {d.mirror} (a few minutes, once)")
        proc = subprocess.run(cmd, env=env, text=True, capture_output=True, timeout=1800, check=False)
        if proc.returncode != 0:
            log_file = root / "debootstrap/debootstrap.log"
            detail = log_file.read_text()[-1500:] if log_file.exists() else ""
            raise ClusterError(f"debootstrap {d.suite} failed (exit {proc.returncode}): {proc.stderr[-500:]} {detail}")
        (root / "etc/apt/sources.list").unlink(missing_ok=True)
        (root / d.sources_path).parent.mkdir(parents=True, exist_ok=True)
        (root / d.sources_path).write_text(d.sources)
        # Each node makes its own host keys and machine id at first start.
        for key in (root / "etc/ssh").glob("ssh_host_*"):
            key.unlink()
        (root / "etc/machine-id").write_text("")
        (root / "var/lib/dbus/machine-id").unlink(missing_ok=True)
        (root / "etc/systemd/system/ssh-hostkeys.service").write_text(HOSTKEY_UNIT)
        wants = root / "etc/systemd/system/multi-user.target.wants"
        wants.mkdir(parents=True, exist_ok=True)
        (wants / "ssh-hostkeys.service").unlink(missing_ok=True)
        (wants / "ssh-hostkeys.service").symlink_to("/etc/systemd/system/ssh-hostkeys.service")
        (root / "etc/ssh/sshd_config.d").mkdir(parents=True, exist_ok=True)
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


def ensure_image(os_name: str = DEFAULT_OS) -> str:
    """Return the tag of the node image for OS, building and importing it only when it is missing."""
    d = distro(os_name)
    tag = image_tag(d)
    if image_exists(tag):
        return tag
    images = CACHE_DIR / "images"
    images.mkdir(parents=True, exist_ok=True)
    with open(images / f".lock-{d.suite}", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one builder per image at a time
        if image_exists(tag):
            return tag
        tarball = images / f"{tag.replace(':', '_')}.tar"
        if not tarball.exists():
            build_rootfs(tarball, d)
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


def ensure_images(os_names: list[str]) -> dict[str, str]:
    """OS name -> image tag for every OS named, building the missing images side by side."""
    wanted = sorted({distro(o).os for o in os_names})
    if any(distro(o).ubuntu and not image_exists(image_tag(distro(o))) for o in wanted):
        # What the Ubuntu builds share is made once, before they run side by side, not three times at once: the
        # archive keyring (one download, one check) and the apt cache (one daemon on its port).
        ubuntu_keyring()
        ensure_apt_cache()
    with ThreadPoolExecutor(max_workers=len(wanted) or 1) as pool:
        tags = dict(zip(wanted, pool.map(ensure_image, wanted), strict=True))
    return tags


# --------------------------------------------------------------------------- an image users train in


def ensure_torch_image(wheelhouse: Path, pin: str, os_name: str = DEFAULT_OS) -> str:
    """The tag of an image to train in, as a site builds its own: the node image for OS (Debian 12: the control
    machine's Python 3.11, which the wheelhouse's torch wheel is built for) with PIN (torch) from WHEELHOUSE installed
    for its python3 (pip --target on this machine, copied in by `docker build`). Built once per node image and
    wheelhouse; kept for later test sessions like the node images."""
    base = ensure_image(os_name)
    stamp = (wheelhouse / ".complete").read_text() if (wheelhouse / ".complete").exists() else ""
    tag = f"clustercheck-torchimage:{hashlib.sha256(f'{base} {stamp} {pin}'.encode()).hexdigest()[:12]}"
    if image_exists(tag):
        return tag
    images = CACHE_DIR / "images"
    images.mkdir(parents=True, exist_ok=True)
    with open(images / ".lock-torchimage", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if image_exists(tag):
            return tag
        version = docker("run", "--rm", base, "python3", "-c", "import sys; print(sys.version_info[:2])").stdout
        if version.strip() != str(sys.version_info[:2]):
            raise ClusterError(f"{base} has Python {version.strip()}, the wheelhouse is for {sys.version_info[:2]}")
        with tempfile.TemporaryDirectory(prefix="torchimage-") as context:
            site = Path(context) / "site"
            log(f"building {tag}: torch for {base}")
            run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--find-links", str(wheelhouse),
                 "--target", str(site), pin], timeout=900)  # fmt: skip
            minor = f"python{sys.version_info[0]}.{sys.version_info[1]}"
            (Path(context) / "Dockerfile").write_text(
                f'FROM {base}\nCOPY site /usr/local/lib/{minor}/dist-packages\nCMD ["python3"]\n'
            )
            # the classic builder: Debian's docker.io has no buildx
            built = subprocess.run(
                ["docker", "build", "-q", "-t", tag, context],
                env={**os.environ, "DOCKER_BUILDKIT": "0"},
                capture_output=True,
                text=True,
                timeout=900,
            )
            if built.returncode != 0:
                raise ClusterError(f"docker build {tag} failed: {(built.stderr.strip().splitlines() or [''])[-1]}")
    return tag
