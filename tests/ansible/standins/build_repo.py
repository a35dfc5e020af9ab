"""A signed apt repository of TEST DOUBLE packages under NVIDIA's package names and versions.

NVIDIA's CUDA repository cannot be reached from the test machines and there is no GPU, so these
small packages stand in for it: they carry NVIDIA's names, versions and dependencies, and install
harmless stand-ins (an nvidia-smi that prints a fake GPU, units that sleep) so that the roles'
repository setup, version pins, holds and service handling run for real. Every package says
"TEST DOUBLE" in its description. Standard library, dpkg-deb, dpkg-scanpackages and gpg only.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

KEYRING_PATH = "usr/share/keyrings/cuda-archive-keyring.gpg"

NVIDIA_SMI = """#!/bin/sh
# TEST DOUBLE of nvidia-smi: no real GPU is present.
echo "GPU 0: TEST DOUBLE GPU (UUID: GPU-00000000-0000-0000-0000-000000000000)"
"""

SLEEP_UNIT = """[Unit]
Description=TEST DOUBLE of {name} (sleeps; no real GPU)

[Service]
ExecStart=/bin/sleep infinity

[Install]
WantedBy=multi-user.target
"""

NVCC = """#!/bin/sh
# TEST DOUBLE of nvcc
echo "nvcc: TEST DOUBLE, release {cuda}"
"""

# The list file the real cuda-keyring drops; the role must replace it with a deb822 source.
KEYRING_LIST = (
    "deb [signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg] "
    "https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/ /\n"
)


@dataclass
class Package:
    name: str
    version: str
    arch: str = "amd64"
    depends: str = ""
    files: dict[str, tuple[str | bytes, int]] | None = None  # path -> (content, mode)


@dataclass
class Repo:
    path: Path
    fingerprint: str
    keyring_sha256: str
    packages: list[Package]


def _driver_files() -> dict[str, tuple[str, int]]:
    return {
        "usr/bin/nvidia-smi": (NVIDIA_SMI, 0o755),
        "lib/systemd/system/nvidia-persistenced.service": (SLEEP_UNIT.format(name="nvidia-persistenced"), 0o644),
    }


def _fabricmanager_files() -> dict[str, tuple[str, int]]:
    return {"lib/systemd/system/nvidia-fabricmanager.service": (SLEEP_UNIT.format(name="nvidia-fabricmanager"), 0o644)}


def _packages(keyring: bytes) -> list[Package]:
    drv = "580.95.05-1"
    return [
        Package(
            "cuda-keyring",
            "1.1-1",
            "all",
            files={
                KEYRING_PATH: (keyring, 0o644),
                "etc/apt/sources.list.d/cuda-debian12-x86_64.list": (KEYRING_LIST, 0o644),
            },
        ),
        Package("nvidia-open-580", drv, depends=f"libnvidia-compute-580 (= {drv})"),
        Package("libnvidia-compute-580", drv, files=_driver_files()),
        Package("nvidia-fabricmanager-580", drv, files=_fabricmanager_files()),
        # A later driver of the same branch: the role installs the branch's newest, and
        # fabricmanager at exactly the driver's version.
        Package("nvidia-open-580", "580.105.08-1", depends="libnvidia-compute-580 (= 580.105.08-1)"),
        Package("libnvidia-compute-580", "580.105.08-1", files=_driver_files()),
        Package("nvidia-fabricmanager-580", "580.105.08-1", files=_fabricmanager_files()),
        Package(
            "cuda-toolkit-12-8", "12.8.1-1", files={"usr/local/cuda-12.8/bin/nvcc": (NVCC.format(cuda="12.8"), 0o755)}
        ),
        Package("cudnn9-cuda-12", "9.10.2.21-1"),
        Package("libnccl2", "2.27.3-1+cuda12.8"),
        Package("libnccl-dev", "2.27.3-1+cuda12.8", depends="libnccl2 (= 2.27.3-1+cuda12.8)"),
        # A newer NCCL: the exact pin and the hold must keep 2.27.3.
        Package("libnccl2", "2.28.3-1+cuda12.8"),
        Package("libnccl-dev", "2.28.3-1+cuda12.8", depends="libnccl2 (= 2.28.3-1+cuda12.8)"),
    ]


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=True, capture_output=True, **kw)


def _build_deb(pkg: Package, out: Path, work: Path) -> None:
    root = work / f"{pkg.name}_{pkg.version}"
    (root / "DEBIAN").mkdir(parents=True)
    for rel, (content, mode) in (pkg.files or {}).items():
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
    control.append(f"Description: TEST DOUBLE of NVIDIA's {pkg.name} (clustercheck tests; no real software)")
    (root / "DEBIAN" / "control").write_text("\n".join(control) + "\n")
    version = pkg.version.replace(":", "%3a")
    _run(["dpkg-deb", "--root-owner-group", "--build", str(root), str(out / f"{pkg.name}_{version}_{pkg.arch}.deb")])


def build(dest: Path) -> Repo:
    """Build the repository into DEST (a flat repository, like NVIDIA's), signed with a fresh test key."""
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
        for pkg in packages:
            _build_deb(pkg, dest, work)
        scan = _run(["dpkg-scanpackages", "--multiversion", "."], cwd=dest, text=True).stdout
        (dest / "Packages").write_text(scan)
        (dest / "Packages.gz").write_bytes(gzip.compress(scan.encode(), mtime=0))
        sums = []
        for name in ("Packages", "Packages.gz"):
            data = (dest / name).read_bytes()
            sums.append(f" {hashlib.sha256(data).hexdigest()} {len(data)} {name}")
        release = "\n".join(
            [
                "Origin: NVIDIA",
                "Label: NVIDIA CUDA",
                "Architectures: amd64 all",
                "Description: TEST DOUBLE of NVIDIA's CUDA repository (clustercheck tests)",
                "SHA256:",
                *sums,
                "",
            ]
        )
        (dest / "Release").write_text(release)
        _run(
            [
                "gpg",
                "--batch",
                "--yes",
                "--clearsign",
                "-u",
                fingerprint,
                "-o",
                str(dest / "InRelease"),
                str(dest / "Release"),
            ],
            env=env,
        )
        _run(
            [
                "gpg",
                "--batch",
                "--yes",
                "-abs",
                "-u",
                fingerprint,
                "-o",
                str(dest / "Release.gpg"),
                str(dest / "Release"),
            ],
            env=env,
        )
        keyring_deb = dest / "cuda-keyring_1.1-1_all.deb"
        return Repo(dest, fingerprint, hashlib.sha256(keyring_deb.read_bytes()).hexdigest(), packages)
    finally:
        shutil.rmtree(gnupg, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
