"""Every `name=version` the NVIDIA roles would install resolves against the stand-in repository.

For each distribution of NVIDIA's repository the roles know, each driver branch shape (570: every
name suffixed; 580: fabric manager and NSCQ unsuffixed, nvidia-fabricmanager-580 virtual; 590: no
suffix, a pinning package), open and proprietary modules, and each CUDA version of cuda_toolkit's
table: the roles' own tables (rendered by Ansible from the roles' vars and pin template) give the
names, apt on this machine resolves them with `apt-get install -s` against the stand-in
(tests/ansible/standins, shapes in SOURCES.md), the way the roles pick versions: the driver's newest
on the branch under the role's pin, fabric manager and NSCQ by the driver's release (`=580.95.05*`),
NCCL by the role's own filter. Nothing is installed; no node is needed.
"""

from __future__ import annotations

import fnmatch
import importlib.util
import itertools
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(REPO / "tests" / "ansible" / "standins"))  # the stand-in repository the converges serve
import build_repo  # noqa: E402

BRANCHES = ["570", "580", "590"]  # one per naming shape in roles/nvidia_driver/vars/main.yml
REPO_DISTROS = sorted(
    {yaml.safe_load(p.read_text())["nvidia_repo_distro"] for p in (REPO / "roles/nvidia_repo/vars").glob("*-*.yml")}
)
CUDA_VERSIONS = sorted(yaml.safe_load((REPO / "roles/cuda_toolkit/vars/main.yml").read_text())["cuda_toolkit_releases"])
NCCL_VERSION = yaml.safe_load((REPO / "roles/nccl/defaults/main.yml").read_text())["nccl_version"]
INST = re.compile(r"^Inst (\S+) (?:\[\S+\] )?\((\S+) ", re.M)


def _nccl_filter():
    spec = importlib.util.spec_from_file_location("nccl_builds", REPO / "roles/nccl/filter_plugins/nccl_builds.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.nccl_builds


class Apt:
    """apt-get and apt-cache on this machine, in a root of their own that knows only one repository."""

    def __init__(self, root: Path, *repo_dirs: Path):
        self.root = root
        for sub in ("etc/apt/apt.conf.d", "etc/apt/preferences.d", "var/lib/apt/lists/partial", "var/cache/apt"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        (root / "var/lib/dpkg").mkdir(parents=True, exist_ok=True)
        (root / "var/lib/dpkg/status").write_text("")
        (root / "etc/apt/sources.list").write_text("".join(f"deb [trusted=yes] file:{d} /\n" for d in repo_dirs))
        self.run("apt-get", "update")

    def run(self, tool: str, *args: str) -> subprocess.CompletedProcess:
        options = [
            f"Dir={self.root}",
            f"Dir::State::status={self.root}/var/lib/dpkg/status",
            "Debug::NoLocking=1",
            "APT::Architecture=amd64",
            "APT::Architectures=amd64",
        ]
        cmd = [tool, *itertools.chain.from_iterable(("-o", o) for o in options), *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120)

    def pin(self, text: str) -> None:
        (self.root / "etc/apt/preferences.d/clustercheck-nvidia-driver").write_text(text)

    def versions(self, name: str) -> list[str]:
        out = self.run("apt-cache", "madison", name).stdout
        return [line.split("|")[1].strip() for line in out.splitlines() if line.count("|") >= 2]

    def simulate(self, *specs: str) -> dict[str, str]:
        proc = self.run("apt-get", "install", "-s", "-q", "--no-install-recommends", *specs)
        assert proc.returncode == 0, f"apt-get install -s {' '.join(specs)}:\n{proc.stdout[-3000:]}\n{proc.stderr}"
        return dict(INST.findall(proc.stdout))


@pytest.fixture(scope="module")
def standin(tmp_path_factory):
    return build_repo.build(tmp_path_factory.mktemp("standin-repo"))


@pytest.fixture(scope="module")
def choices(tmp_path_factory):
    """The roles' package choices for every source, branch, module flavour and CUDA version."""
    cases = [
        {"source": source, "branch": branch, "open": flavour, "cuda": cuda}
        for source in ("cuda_repo", "ubuntu")
        for branch in BRANCHES
        for flavour in (True, False)
        for cuda in CUDA_VERSIONS
    ]
    out = tmp_path_factory.mktemp("resolve") / "choices.json"
    extra = tmp_path_factory.mktemp("resolve") / "cases.json"
    extra.write_text(json.dumps({"resolve_cases": cases, "resolve_out": str(out)}))
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), str(HERE / "resolve-packages.yml"), "-e", f"@{extra}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    return json.loads(out.read_text())


def _upstream(version: str) -> str:
    return re.sub(r"-[^-]*$", "", version.split(":", 1)[-1])


def test_the_roles_tables_are_covered(choices):
    """The cases the resolution below walks are every CUDA version of the table and every branch shape."""
    assert {c["case"]["cuda"] for c in choices} == set(CUDA_VERSIONS) and len(CUDA_VERSIONS) >= 3
    names = {
        c["case"]["branch"]: c["driver"][0] for c in choices if c["case"]["source"] == "cuda_repo" and c["case"]["open"]
    }
    assert names == {"570": "nvidia-open-570", "580": "nvidia-open-580", "590": "nvidia-open"}
    assert set(REPO_DISTROS) == set(build_repo.DISTROS)


@pytest.mark.parametrize("distro", REPO_DISTROS)
def test_every_package_the_roles_install_resolves(distro, standin, choices, tmp_path):
    apt = Apt(tmp_path / "apt", standin.distro_path(distro))
    nccl_builds = _nccl_filter()
    offered_nccl = apt.versions("libnccl2")
    for choice in (c for c in choices if c["case"]["source"] == "cuda_repo"):
        case, branch = choice["case"], choice["case"]["branch"]
        apt.pin(choice["pin"])
        # The driver: the branch's newest, under the role's pin (the pinning package first from 590).
        chosen = apt.simulate(*choice["pinning"], *choice["driver"])
        driver = chosen[choice["driver"][0]]
        assert driver.startswith(branch + "."), f"{case}: {choice['driver'][0]} {driver} is not on branch {branch}"
        assert all(v.startswith(branch + ".") for n, v in chosen.items() if "pinning" not in n), (case, chosen)
        # Fabric manager and NSCQ: by the driver's release, whatever their revision.
        release = _upstream(driver)
        specs = [f"{name}={driver}" for name in choice["driver"]] + choice["pinning"]
        for name in choice["fabricmanager"]:
            matching = fnmatch.filter(apt.versions(name), release + "*")
            assert matching, f"{case}: no {name} of release {release} (offered: {apt.versions(name)})"
            specs.append(f"{name}={matching[0]}")
        specs.append(choice["nvlsm"])
        # CUDA, cuDNN and NCCL at the versions the roles choose.
        specs += [f"{name}={version}" for name, version in choice["cuda"].items()]
        nccl = nccl_builds(offered_nccl, case["cuda"], NCCL_VERSION)
        assert nccl, f"{case}: no NCCL {NCCL_VERSION} build for CUDA {case['cuda']} in {offered_nccl}"
        specs += [f"libnccl2={nccl[0]}", f"libnccl-dev={nccl[0]}"]
        installed = apt.simulate(*specs)
        for spec in specs:
            name, _, version = spec.partition("=")
            assert name in installed and (not version or installed[name] == version), f"{case}: {spec} -> {installed}"


def test_copying_the_driver_revision_to_fabric_manager_does_not_resolve(standin, choices, tmp_path):
    """Why the roles match the release: the metapackage's exact version names no fabric manager build, and
    apt refuses the virtual nvidia-fabricmanager-580 with a version (the failure the roles used to hit)."""
    apt = Apt(tmp_path / "apt", standin.distro_path("ubuntu2404"))
    driver = max(apt.versions("nvidia-open-580"), key=lambda v: [int(n) for n in re.findall(r"\d+", v)])
    for spec in (f"nvidia-fabricmanager={driver}", f"nvidia-fabricmanager-580={driver}"):
        proc = apt.run("apt-get", "install", "-s", "-q", spec)
        assert proc.returncode != 0, spec
    assert "virtual package" in apt.run("apt-get", "install", "-s", "-q", "nvidia-fabricmanager-580").stdout


def test_canonicals_builds_never_mix_into_a_driver_from_nvidias_repository(standin, choices, tmp_path):
    """With Canonical's multiverse beside NVIDIA's repository (as on an Ubuntu node), the name the role once
    installed fabric manager by, nvidia-fabricmanager-580, is Canonical's real package (it provides and
    conflicts with NVIDIA's nvidia-fabricmanager): only the role's source pin keeps it out."""
    canonical = build_repo.build_canonical(tmp_path / "canonical")
    apt = Apt(tmp_path / "apt", standin.distro_path("ubuntu2404"), canonical)
    canonical_version = build_repo.CANONICAL_FABRICMANAGER.version
    assert apt.simulate("nvidia-fabricmanager-580")["nvidia-fabricmanager-580"] == canonical_version  # no pin: mixed
    choice = next(
        c for c in choices if c["case"] == {"source": "cuda_repo", "branch": "580", "open": True, "cuda": "12.8"}
    )
    apt.pin(choice["pin"])
    proc = apt.run("apt-get", "install", "-s", "-q", "nvidia-fabricmanager-580")
    assert canonical_version not in proc.stdout, proc.stdout
    policy = apt.run("apt-cache", "policy", "nvidia-fabricmanager-580").stdout
    assert f"{canonical_version} -1" in policy and "Candidate: (none)" in policy, policy
    # What the role installs resolves to NVIDIA's build.
    installed = apt.simulate("nvidia-fabricmanager=580.105.08-1", "libnvidia-nscq=580.105.08-1")
    assert installed == {"nvidia-fabricmanager": "580.105.08-1", "libnvidia-nscq": "580.105.08-1"}
