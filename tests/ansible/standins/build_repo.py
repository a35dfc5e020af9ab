"""A signed apt repository of TEST DOUBLE packages in the shapes NVIDIA's CUDA repository publishes.

NVIDIA's CUDA repository cannot be reached from the test machines and there is no GPU, so these
small packages stand in for it. They carry the names, versions, revisions, dependencies and
virtual packages NVIDIA really publishes (each shape cites its public source in SOURCES.md, beside
this file), and install harmless stand-ins (an nvidia-smi that prints a fake GPU, a
nvidia-persistenced that only sleeps, under the unit Ubuntu ships) so that the roles' repository
setup, package choice, pins, holds and service handling run for real. Every package says
"TEST DOUBLE" in its description. Standard library, dpkg-deb, dpkg-scanpackages and gpg only.

One flat repository per distribution and architecture, laid out like NVIDIA's
(<distro>/x86_64/, e.g. ubuntu2404/x86_64/). NVIDIA's per-release differences are not modelled:
every release gets the same packages (see SOURCES.md).
"""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

KEYRING_PATH = "usr/share/keyrings/cuda-archive-keyring.gpg"
DISTROS = ("ubuntu2004", "ubuntu2204", "ubuntu2404", "debian12")
ARCH_DIR = "x86_64"

NVIDIA_SMI = """#!/bin/sh
# TEST DOUBLE of nvidia-smi {version}: no real GPU is present.
echo "GPU 0: TEST DOUBLE GPU (UUID: GPU-00000000-0000-0000-0000-000000000000)"
"""

# The unit as Canonical's nvidia-compute-utils-580-server 580.178.04-0ubuntu0.24.04.1 ships it
# (usr/lib/systemd/system/nvidia-persistenced.service, read from the .deb): static, runs
# --no-persistence-mode and stops when no other unit needs it. NVIDIA's Ubuntu packaging is built from
# the same sources (NVIDIA/ubuntu-packaging-nvidia-driver, debian/nvidia-persistenced.service).
PERSISTENCED_UNIT = """[Unit]
Description=NVIDIA Persistence Daemon
Wants=syslog.target
StopWhenUnneeded=true
Before=systemd-backlight@backlight:nvidia_0.service

[Service]
Type=forking
ExecStart=/usr/bin/nvidia-persistenced --user nvidia-persistenced --no-persistence-mode --verbose
ExecStopPost=/bin/rm -rf /var/run/nvidia-persistenced
"""

# Forks like the real daemon (Type=forking) and records the arguments it was started with.
PERSISTENCED = """#!/bin/sh
# TEST DOUBLE of nvidia-persistenced: no real GPU is present; records its arguments and sleeps.
mkdir -p /var/run/nvidia-persistenced
echo "$@" > /var/run/nvidia-persistenced/args
setsid sleep infinity </dev/null >/dev/null 2>&1 &
exit 0
"""

FABRICMANAGER_UNIT = """[Unit]
Description=TEST DOUBLE of NVIDIA fabric manager (sleeps; no real NVSwitch)

[Service]
ExecStart=/bin/sleep infinity

[Install]
WantedBy=multi-user.target
"""

# cuda-keyring installs a list file for its repository itself (NVIDIA/ansible-role-nvidia-driver pull
# request #59); the role must replace it with its deb822 source.
KEYRING_LIST = (
    "deb [signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg] "
    "https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/ /\n"
)

NVCC = """#!/bin/sh
# TEST DOUBLE of nvcc
echo "nvcc: TEST DOUBLE, release {cuda}"
"""


# NCCL: each release built for a few CUDA minors only (none of 2.27.x for 12.8), as NVIDIA's repository publishes.
NCCL_BUILDS = (
    "2.25.1-1+cuda12.8",
    "2.26.2-1+cuda12.8",
    "2.27.3-1+cuda12.4",
    "2.27.3-1+cuda12.9",
    "2.27.7-1+cuda12.4",
    "2.27.7-1+cuda12.9",
    "2.27.7-1+cuda13.0",
)


@dataclass
class Package:
    name: str
    version: str
    arch: str = "amd64"
    depends: str = ""
    provides: str = ""
    conflicts: str = ""
    files: dict[str, tuple[str | bytes, int]] = field(default_factory=dict)  # path -> (content, mode)


@dataclass
class Repo:
    path: Path
    fingerprint: str
    keyring_sha256: str
    packages: list[Package]
    url: str = ""
    served_at: str = ""  # http://host:port of the toolkit's repository and key (the same tree), once served

    def distro_path(self, distro: str) -> Path:
        return self.path / distro / ARCH_DIR


# NVIDIA's Container Toolkit repository (nvidia.github.io/libnvidia-container): one flat repository per architecture
# under stable/deb/, its key published ASCII-armored beside it (SOURCES.md).
TOOLKIT_DIR = "libnvidia-container/stable/deb"
TOOLKIT_KEY = "libnvidia-container/gpgkey"
TOOLKIT_VERSIONS = ("1.19.0-1", "1.20.0-1")

NVIDIA_CTK = """#!/bin/sh
# TEST DOUBLE of nvidia-ctk {version}: no real GPU is present.
echo "NVIDIA Container Toolkit CLI version {version} (TEST DOUBLE)"
"""


def _toolkit_packages() -> list[Package]:
    """The toolkit's four packages per release, with the dependencies their control files declare."""
    packages = []
    for v in TOOLKIT_VERSIONS:
        packages += [
            Package(
                "nvidia-container-toolkit",
                v,
                depends=f"nvidia-container-toolkit-base (= {v}), libnvidia-container-tools (= {v}), "
                "libnvidia-container-tools (<< 2.0.0)",
            ),
            Package(
                "nvidia-container-toolkit-base",
                v,
                files={"usr/bin/nvidia-ctk": (NVIDIA_CTK.format(version=v.split("-")[0]), 0o755)},
            ),
            Package("libnvidia-container-tools", v, depends=f"libnvidia-container1 (>= {v})"),
            Package("libnvidia-container1", v),
        ]
    return packages


def _driver_release(suffix: str, version: str) -> list[Package]:
    """One driver release under NVIDIA's Ubuntu packaging: metapackages and libraries at one revision
    (SOURCES.md: driver metapackages), with nvidia-smi and Ubuntu's persistenced unit."""
    name = (lambda base: f"{base}-{suffix}") if suffix else (lambda base: base)
    same = ", ".join(f"{name(p)} (= {version})" for p in ("libnvidia-compute", "nvidia-compute-utils", "nvidia-utils"))
    return [
        Package(name("nvidia-open"), version, depends=same),
        Package(name("cuda-drivers"), version, depends=same),
        Package(name("libnvidia-compute"), version),
        Package(
            name("nvidia-compute-utils"),
            version,
            files={
                "usr/bin/nvidia-persistenced": (PERSISTENCED, 0o755),
                "usr/lib/systemd/system/nvidia-persistenced.service": (PERSISTENCED_UNIT, 0o644),
            },
        ),
        Package(
            name("nvidia-utils"), version, files={"usr/bin/nvidia-smi": (NVIDIA_SMI.format(version=version), 0o755)}
        ),
    ]


def _fabricmanager(name: str, version: str, provides: str = "") -> list[Package]:
    nscq = (
        "libnvidia-nscq" if name == "nvidia-fabricmanager" else name.replace("nvidia-fabricmanager", "libnvidia-nscq")
    )
    unit = {"lib/systemd/system/nvidia-fabricmanager.service": (FABRICMANAGER_UNIT, 0o644)}
    return [Package(name, version, provides=provides, files=unit), Package(nscq, version)]


def _packages(keyring: bytes) -> list[Package]:
    packages = [
        Package(
            "cuda-keyring",
            "1.1-1",
            "all",
            files={
                KEYRING_PATH: (keyring, 0o644),
                "etc/apt/sources.list.d/cuda-debian12-x86_64.list": (KEYRING_LIST, 0o644),
            },
        ),
        # Branch 570: every name carries the branch, fabric manager too.
        *_driver_release("570", "570.124.06-0ubuntu1"),
        *_fabricmanager("nvidia-fabricmanager-570", "570.124.06-1"),
        # Branch 580: two releases; the newer with the later revision scheme. Fabric manager and NSCQ lose
        # the suffix, nvidia-fabricmanager-580 is only a virtual package, and their revision is -1.
        *_driver_release("580", "580.95.05-0ubuntu1"),
        *_fabricmanager("nvidia-fabricmanager", "580.95.05-1", provides="nvidia-fabricmanager-580"),
        *_driver_release("580", "580.105.08-1ubuntu1"),
        *_fabricmanager("nvidia-fabricmanager", "580.105.08-1", provides="nvidia-fabricmanager-580"),
        # Branches 590 and later: no suffix at all; a pinning package per branch. A later branch (595)
        # under the same names: only the branch pin keeps a 590 node on 590.
        Package("nvidia-driver-pinning-590", "590-2ubuntu1", "all"),
        *_driver_release("", "590.48.01-1ubuntu1"),
        *_fabricmanager("nvidia-fabricmanager", "590.48.01-1"),
        Package("nvidia-driver-pinning-595", "595-2ubuntu1", "all"),
        *_driver_release("", "595.71.05-1ubuntu1"),
        *_fabricmanager("nvidia-fabricmanager", "595.71.05-1"),
        # NVLink subnet manager: one package, date-based versions, not tied to a driver branch.
        Package("nvlsm", "2025.06.10-1"),
    ]
    for cuda, version in (("12.8", "12.8.1-1"), ("12.9", "12.9.1-1"), ("13.0", "13.0.2-1")):
        nvcc = {f"usr/local/cuda-{cuda}/bin/nvcc": (NVCC.format(cuda=cuda), 0o755)}
        packages.append(Package(f"cuda-toolkit-{cuda.replace('.', '-')}", version, files=nvcc))
    packages += [Package("cudnn9-cuda-12", "9.10.2.21-1"), Package("cudnn9-cuda-13", "9.17.1.4-1")]
    for build in NCCL_BUILDS:
        packages += [Package("libnccl2", build), Package("libnccl-dev", build, depends=f"libnccl2 (= {build})")]
    return packages


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=True, capture_output=True, **kw)


def _build_deb(pkg: Package, out: Path, work: Path) -> Path:
    root = work / f"{pkg.name}_{pkg.version}"
    (root / "DEBIAN").mkdir(parents=True)
    for rel, (content, mode) in pkg.files.items():
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content if isinstance(content, bytes) else content.encode())
        target.chmod(mode)
    control = [
        f"Package: {pkg.name}",
        f"Version: {pkg.version}",
        f"Architecture: {pkg.arch}",
        "Maintainer: clustercheck tests <tests@clustercheck.invalid>",
        "Section: misc",
        "Priority: optional",
    ]
    if pkg.depends:
        control.append(f"Depends: {pkg.depends}")
    if pkg.provides:
        control.append(f"Provides: {pkg.provides}")
    if pkg.conflicts:
        control.append(f"Conflicts: {pkg.conflicts}")
    control.append(f"Description: TEST DOUBLE of NVIDIA's {pkg.name} (clustercheck tests; no real software)")
    (root / "DEBIAN" / "control").write_text("\n".join(control) + "\n")
    deb = out / f"{pkg.name}_{pkg.version.replace(':', '%3a')}_{pkg.arch}.deb"
    _run(["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(root), str(deb)])
    return deb


def _release(repo_dir: Path, origin: str) -> None:
    """Packages and Release for one flat repository."""
    scan = _run(["dpkg-scanpackages", "--multiversion", "."], cwd=repo_dir, text=True).stdout
    (repo_dir / "Packages").write_text(scan)
    (repo_dir / "Packages.gz").write_bytes(gzip.compress(scan.encode(), mtime=0))
    sums = []
    for name in ("Packages", "Packages.gz"):
        data = (repo_dir / name).read_bytes()
        sums.append(f" {hashlib.sha256(data).hexdigest()} {len(data)} {name}")
    release = [
        f"Origin: {origin}",
        f"Label: {origin}",
        "Architectures: amd64 all",
        f"Description: TEST DOUBLE of {origin}'s packages (clustercheck tests)",
        "SHA256:",
        *sums,
        "",
    ]
    (repo_dir / "Release").write_text("\n".join(release))


def _index(repo_dir: Path, fingerprint: str, env: dict[str, str]) -> None:
    """Packages, Release and its signatures for one flat repository, as NVIDIA's has them."""
    _release(repo_dir, "NVIDIA")
    sign = ["gpg", "--batch", "--yes", "-u", fingerprint]
    _run([*sign, "--clearsign", "-o", str(repo_dir / "InRelease"), str(repo_dir / "Release")], env=env)
    _run([*sign, "-abs", "-o", str(repo_dir / "Release.gpg"), str(repo_dir / "Release")], env=env)


def build(dest: Path) -> Repo:
    """Build DEST/<distro>/x86_64/ for every distribution, signed with a fresh test key."""
    dest.mkdir(parents=True, exist_ok=True)
    gnupg = Path(tempfile.mkdtemp(prefix="standin-gpg-"))
    work = Path(tempfile.mkdtemp(prefix="standin-debs-"))
    env = {**os.environ, "GNUPGHOME": str(gnupg)}
    try:
        gnupg.chmod(0o700)
        uid = "clustercheck TEST DOUBLE CUDA repository key <tests@clustercheck.invalid>"
        _run(["gpg", "--batch", "--passphrase", "", "--quick-gen-key", uid, "rsa3072", "sign", "1d"], env=env)
        listing = _run(["gpg", "--batch", "--with-colons", "--list-keys"], env=env, text=True).stdout
        fingerprint = next(line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr"))
        keyring = _run(["gpg", "--batch", "--export", fingerprint], env=env).stdout
        packages = _packages(keyring)
        pool = dest / "pool"
        pool.mkdir(exist_ok=True)
        debs = [_build_deb(pkg, pool, work) for pkg in packages]
        for distro in DISTROS:
            repo_dir = dest / distro / ARCH_DIR
            repo_dir.mkdir(parents=True, exist_ok=True)
            for deb in debs:
                os.link(deb, repo_dir / deb.name)
            _index(repo_dir, fingerprint, env)
        toolkit = [_build_deb(pkg, pool, work) for pkg in _toolkit_packages()]
        toolkit_dir = dest / TOOLKIT_DIR / "amd64"
        toolkit_dir.mkdir(parents=True, exist_ok=True)
        for deb in toolkit:
            os.link(deb, toolkit_dir / deb.name)
        _index(toolkit_dir, fingerprint, env)
        armored = _run(["gpg", "--batch", "--armor", "--export", fingerprint], env=env).stdout
        (dest / TOOLKIT_KEY).write_bytes(armored)
        keyring_deb = pool / "cuda-keyring_1.1-1_all.deb"
        return Repo(dest, fingerprint, hashlib.sha256(keyring_deb.read_bytes()).hexdigest(), packages)
    finally:
        shutil.rmtree(gnupg, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


# Canonical's build of a name NVIDIA's packages use, as noble-updates/multiverse's Packages index lists it
# (archive.ubuntu.com, 2026-11-22; its Depends on Canonical's driver left out): a real package that
# provides and conflicts with NVIDIA's real nvidia-fabricmanager.
CANONICAL_FABRICMANAGER = Package(
    "nvidia-fabricmanager-580",
    "580.178.04-0ubuntu0.24.04.1",
    provides="nvidia-fabricmanager",
    conflicts="nvidia-fabricmanager",
    files={"lib/systemd/system/nvidia-fabricmanager.service": (FABRICMANAGER_UNIT, 0o644)},
)


def build_canonical(dest: Path) -> Path:
    """A flat repository with Release Origin: Ubuntu holding a TEST DOUBLE of Canonical's nvidia-fabricmanager-580
    (unsigned: read with [trusted=yes]); returns its directory."""
    dest.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="standin-debs-"))
    try:
        _build_deb(CANONICAL_FABRICMANAGER, dest, work)
        _release(dest, "Ubuntu")
        return dest
    finally:
        shutil.rmtree(work, ignore_errors=True)
