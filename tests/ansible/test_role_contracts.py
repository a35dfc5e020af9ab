"""Role contracts that need no nodes: specs cover the defaults, the README's tables are current,
the address filters decide right, the conda checksum script parses what Miniforge publishes."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent.parent
ROLES = sorted(p.name for p in (REPO / "roles").iterdir() if p.is_dir())


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_site_applies_the_roles_in_order():
    plays = yaml.safe_load((REPO / "playbooks" / "nodes.yml").read_text())
    roles = [r["role"] for r in plays[1]["roles"]]
    assert roles == [
        "base",
        "cluster_hosts",
        "nvidia_driver",
        "cuda_toolkit",
        "nccl",
        "python_env",
        "firewall",
        "ssh_trust",
    ]
    assert all(r["tags"] == [r["role"]] for r in plays[1]["roles"])


@pytest.mark.parametrize("role", ROLES)
def test_argument_specs_cover_every_default(role):
    defaults = yaml.safe_load((REPO / "roles" / role / "defaults" / "main.yml").read_text()) or {}
    options = yaml.safe_load((REPO / "roles" / role / "meta" / "argument_specs.yml").read_text())["argument_specs"][
        "main"
    ]["options"]
    assert set(defaults) <= set(options), f"not in argument_specs: {set(defaults) - set(options)}"
    for name, option in options.items():
        assert option.get("description"), f"{name} has no description"
        assert option.get("type"), f"{name} has no type"
        if name in defaults and "default" in option:
            assert option["default"] == defaults[name], f"{name}: spec default differs from defaults/main.yml"
    for required in ("meta/main.yml", "tasks/main.yml"):
        assert (REPO / "roles" / role / required).exists()
    # A vars/<distro>.yml only where the distribution really differs: a role that loads them by
    # first_found also has the default.yml they fall back to.
    vars_dir = REPO / "roles" / role / "vars"
    if any(vars_dir.glob("*-*.yml")):
        assert (vars_dir / "default.yml").exists(), f"{role} has distribution vars but no vars/default.yml"


def test_readme_role_variables_are_generated_and_current():
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "role_docs.py"), "--check"], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr


def test_role_docs_render_every_option():
    role_docs = _load(REPO / "scripts" / "role_docs.py", "role_docs")
    text = role_docs.render()
    assert "| `nvidia_driver_branch` | str | `580` |" in text
    assert "| `cluster_cidr` |" in text and "| `pytorch_wheelhouse` |" in text


def test_address_filters():
    net = _load(REPO / "roles" / "cluster_hosts" / "filter_plugins" / "clustercheck_net.py", "clustercheck_net")
    assert net.in_cidr("10.0.0.5", "10.0.0.0/24")
    assert not net.in_cidr("10.0.1.5", "10.0.0.0/24")
    assert net.in_cidr("192.0.2.1", "any")
    assert not net.in_cidr("not-an-address", "10.0.0.0/8")
    assert not net.in_cidr("", "10.0.0.0/8")
    assert net.network_of("172.30.80.11", "255.255.255.0") == "172.30.80.0/24"
    faces = [{"device": "lo", "ipv4": {"address": "127.0.0.1"}}, {"device": "eth0", "ipv4": {"address": "10.0.0.5"}}]
    assert [f["device"] for f in net.interfaces_in_cidr(faces, "10.0.0.0/16")] == ["eth0"]


def test_conda_checksum_table_parser():
    script = _load(REPO / "scripts" / "conda_installer_sha256.py", "conda_installer_sha256")
    digest = "2e1ad2188fe69fcdd522c2b20c08c800a5c7411b775eca768318b1540ed32e53"
    assert script.parse_sha256_file(f"{digest}  Miniforge3-24.11.3-0-Linux-x86_64.sh\n") == digest
    with pytest.raises(ValueError):
        script.parse_sha256_file("Not Found")
    assert script.installer_names("24.11.3-0")[0] == "Miniforge3-24.11.3-0-Linux-x86_64.sh"
    defaults = yaml.safe_load((REPO / "roles" / "python_env" / "defaults" / "main.yml").read_text())
    assert defaults["python_env_conda_installer_sha256"]["Miniforge3-24.11.3-0-Linux-x86_64.sh"] == digest
