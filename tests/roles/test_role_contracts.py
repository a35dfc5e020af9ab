"""Role contracts that need no nodes: specs cover and describe the defaults, enumerated options have choices that
Ansible enforces, the role tables (docs/roles.md) are current, the address filters decide right, the conda checksum
script parses what Miniforge publishes."""

from __future__ import annotations

import importlib.util
import json
import os
import re
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


def test_site_applies_every_role_with_its_own_tag_and_the_readme_says_the_order():
    """The order is written once, in playbooks/nodes.yml; the README's sentence follows it."""
    role_docs = _load(REPO / "scripts" / "role_docs.py", "role_docs")
    plays = yaml.safe_load((REPO / "playbooks" / "nodes.yml").read_text())
    entries = [r for play in plays for r in play.get("roles", [])]
    assert all(r["tags"] == [r["role"]] for r in entries)
    order = role_docs.site_roles()
    # every role is applied, or used by one that is (nvidia_repo and nvidia_gpu, by the NVIDIA roles; clustercheck_tool,
    # by slurm and monitoring; wheelhouse, by python_env and clustercheck_tool)
    assert set(ROLES) - set(order) == {"nvidia_repo", "nvidia_gpu", "clustercheck_tool", "wheelhouse"}
    sentence = (REPO / "README.md").read_text().split("applies the roles in this order", 1)[1].split(".", 1)[0]
    assert [w.strip("`") for w in re.findall(r"`(\w+)`", sentence) if w != "nvidia_repo"] == order


def test_no_linked_roles_or_plugins():
    """ansible.cfg says where the roles and the shared filters are; no directory links to them."""
    links = [p for p in REPO.rglob("*") if p.is_symlink() and ".venv" not in p.parts and ".git" not in p.parts]
    assert links == []
    cfg = (REPO / "ansible.cfg").read_text()
    assert "roles_path = roles" in cfg and "filter_plugins = filter_plugins" in cfg


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


def _options(role: str) -> dict[str, dict]:
    path = REPO / "roles" / role / "meta" / "argument_specs.yml"
    return yaml.safe_load(path.read_text())["argument_specs"]["main"]["options"]


DEFAULTS_POINTER = (
    "# Values only: what each variable means is in meta/argument_specs.yml (and docs/roles.md, generated from them)."
)


@pytest.mark.parametrize("role", ROLES)
def test_a_variable_is_described_once_in_its_argument_spec(role):
    """The argument specs are where a variable is described: Ansible validates against them and docs/roles.md's
    tables are made from them. defaults/main.yml holds the values and one line that says so, not a second
    description."""
    lines = (REPO / "roles" / role / "defaults" / "main.yml").read_text().splitlines()
    assert [line for line in lines if line.lstrip().startswith("#")] == [DEFAULTS_POINTER]
    descriptions = {name: " ".join(str(option["description"]).split()) for name, option in _options(role).items()}
    for name, text in descriptions.items():
        assert text != name, f"{name}: the description is only the variable's name"
    assert len(set(descriptions.values())) == len(descriptions), f"{role}: two variables share a description"


@pytest.mark.parametrize("role", ROLES)
def test_a_default_the_spec_cannot_state_is_computed_in_defaults(role):
    """An option without a default in its spec is one defaults/main.yml computes (a template); its description says
    so, and docs/roles.md's table shows it as computed rather than as an empty default."""
    defaults = yaml.safe_load((REPO / "roles" / role / "defaults" / "main.yml").read_text()) or {}
    for name, option in _options(role).items():
        computed = isinstance(defaults.get(name), str) and "{{" in defaults[name]
        stated = "default" in option or option.get("required", False)  # a required option has no default
        assert computed != stated, f"{name}: the spec's default and defaults/main.yml disagree"
        if computed:
            pointer = f"Default: computed (see roles/{role}/defaults/main.yml)."
            assert " ".join(option["description"].split()).endswith(pointer), name


AUTO_STYLE = ["auto", "true", "false"]  # the tasks read these as `== 'auto'`, else `| bool`
BOOLEAN_WORDS = {"true", "false", "yes", "no", "on", "off"}


def _closed_set(option: dict) -> list[str] | None:
    """The values an option's default or description shows to be its only ones; None for an open option.

    A str option is enumerated when its default is auto or a boolean word, when its description says what auto means
    ("auto: ..."), when the description lists the values in parentheses with the default among them ("(off, low,
    medium, high, full)"), or when it gives the default's meaning as a glossary entry ("conda: ...; venv: ...")."""
    if option.get("type", "str") != "str" or "default" not in option:
        return None
    default = str(option["default"])
    text = " ".join(str(option.get("description", "")).split())
    if default.lower() in {"auto"} | BOOLEAN_WORDS or re.search(r"(^|\s)auto: ", text):
        return AUTO_STYLE
    for group in re.findall(r"\(([^()]*)\)", text):
        items = [item.strip() for item in group.split(",")]
        if len(items) > 1 and default in items and all(re.fullmatch(r"[\w.-]+", item) for item in items):
            return items
    glossary = re.findall(r"(?:^|[.;] )([a-z][\w.-]*): ", text)
    return glossary if default in glossary else None


ENUMERATED = {
    (role, name): values
    for role in ROLES
    for name, option in _options(role).items()
    if (values := _closed_set(option)) is not None
}


def test_the_closed_set_finder_sees_every_kind_of_enumeration():
    """_closed_set reads the specs' own words: an auto option, values listed in parentheses, a glossary."""
    assert ENUMERATED[("base", "base_kernel_headers")] == AUTO_STYLE
    assert ENUMERATED[("firewall", "firewall_logging")] == ["off", "low", "medium", "high", "full"]
    assert ENUMERATED[("python_env", "python_env_manager")] == ["conda", "venv"]
    assert ENUMERATED[("nvidia_driver", "nvidia_driver_source")] == ["cuda_repo", "ubuntu"]
    # open values stay open: a CIDR or "any", a size, a branch, cpu or any cuXYZ
    for role, name in [
        ("firewall", "firewall_admin_cidr"),
        ("base", "base_limits_memlock"),
        ("base", "base_shm_size"),
        ("nvidia_driver", "nvidia_driver_branch"),
        ("python_env", "python_env_pytorch_variant"),
        ("python_env", "python_env_venv_python"),
    ]:
        assert (role, name) not in ENUMERATED


@pytest.mark.parametrize("role, name", sorted(ENUMERATED), ids=[n for _, n in sorted(ENUMERATED)])
def test_every_enumerated_option_has_choices_and_its_default_is_one(role, name):
    """Without choices Ansible takes any string: `base_kernel_headers: ture` would silently mean false."""
    option = _options(role)[name]
    assert "choices" in option, f"{role}: {name} takes one of {ENUMERATED[role, name]} but has no choices"
    choices = [str(c) for c in option["choices"]]
    assert str(option["default"]) in choices, f"{name}: the default is not one of its choices"
    if ENUMERATED[role, name] == AUTO_STYLE:
        assert choices == AUTO_STYLE, f"{name}: an auto option's choices are {AUTO_STYLE}"
    else:
        assert set(ENUMERATED[role, name]) <= set(choices), f"{name}: the description names values the choices lack"


@pytest.mark.parametrize("role", ROLES)
def test_choices_are_strings_and_hold_the_roles_default(role):
    """A str option's choices are strings ('true', quoted): `-e nccl_install=true` passes a string, which an unquoted
    YAML true in the choices would refuse. The value defaults/main.yml sets is one of them."""
    defaults = yaml.safe_load((REPO / "roles" / role / "defaults" / "main.yml").read_text()) or {}
    for name, option in _options(role).items():
        if "choices" not in option:
            continue
        assert all(isinstance(c, str) for c in option["choices"]), f"{name}: {option['choices']}"
        if option.get("type") == "list":  # the choices are those of each element
            assert set(option.get("default", [])) <= set(option["choices"]), f"{name}: a default element is no choice"
            assert set(defaults.get(name, [])) <= set(option["choices"]), (
                f"{name}: defaults/main.yml sets {defaults[name]}"
            )
            continue
        if "default" in option:
            assert option["default"] in option["choices"], f"{name}: the spec's default is not one of its choices"
        if name in defaults:
            assert str(defaults[name]) in option["choices"], f"{name}: defaults/main.yml sets {defaults[name]!r}"


def test_ansible_refuses_a_value_outside_the_choices_when_the_role_starts(tmp_path):
    """ansible-playbook itself, on this machine (a local connection): a play with every role, run in check mode with
    a tag no task has, runs only what every role runs first, Ansible's validation of the role's arguments (tagged
    always). A host per role, given a misspelt value for each of the role's enumerated options, fails there with a
    message naming each; the hosts with the defaults, with YAML booleans, and with the strings `-e name=false` passes
    run through every role."""
    python = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    python |= {"wheelhouse_src": str(tmp_path), "wheelhouse_dest": "/nonexistent"}  # the wheelhouse role's required
    misspelt: dict[str, dict] = {}
    for role, name in ENUMERATED:
        misspelt.setdefault(f"misspelt-{role}", {})[name] = "ture"
    auto = [name for (role, name), values in ENUMERATED.items() if values == AUTO_STYLE]
    hosts = {host: {**python, **values} for host, values in misspelt.items()}
    hosts["defaults"] = dict(python)
    hosts["yaml-booleans"] = {**python, **{name: True for name in auto}}
    hosts["strings"] = {**python, **{name: "false" for name in auto}}
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
    play = [{"name": "Roles' arguments", "hosts": "all", "gather_subset": ["!all"], "roles": ROLES}]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    ansible_playbook = str(Path(sys.executable).parent / "ansible-playbook")
    proc = subprocess.run(
        [
            ansible_playbook,
            "-i",
            str(tmp_path / "inventory.yml"),
            "--check",
            "--tags",
            "no_task_has_this_tag",
            "play.yml",
        ],
        cwd=tmp_path,
        env={**os.environ, "ANSIBLE_NOCOLOR": "1", "ANSIBLE_CONFIG": str(REPO / "ansible.cfg")},
        capture_output=True,
        text=True,
        timeout=300,
    )
    tasks = set(re.findall(r"^TASK \[(?:\w+ : )?(.*?)\] \*+$", proc.stdout, re.M))
    assert all(t == "Gathering Facts" or t.startswith("Validating arguments against arg spec") for t in tasks), tasks
    recap = {
        host: dict(re.findall(r"(\w+)=(\d+)", counts))
        for host, counts in re.findall(r"^(\S+)\s+: (ok=.*)$", proc.stdout, re.M)
    }
    for host in ("defaults", "yaml-booleans", "strings"):
        assert recap[host]["failed"] == "0" and int(recap[host]["ok"]) > len(ROLES), (host, recap[host])
    fatal = re.findall(r"^fatal: \[(\S+)\]: FAILED! => (\{.*\})$", proc.stdout, re.M)
    messages = {host: json.loads(outcome)["msg"] for host, outcome in fatal}
    assert set(messages) == set(misspelt), proc.stdout[-3000:]
    for role, name in ENUMERATED:
        choices = ", ".join(str(c) for c in _options(role)[name]["choices"])
        assert f"value of {name} must be one of: {choices}, got: ture" in messages[f"misspelt-{role}"]
    assert proc.returncode == 2


@pytest.mark.parametrize("role", ROLES)
def test_a_vars_file_only_where_a_distribution_differs(role):
    """vars/<distribution>[-<version>].yml exists only where it says something vars/default.yml does not."""
    vars_dir = REPO / "roles" / role / "vars"
    default = vars_dir / "default.yml"
    for path in vars_dir.glob("*.yml"):
        if path.name in ("main.yml", "default.yml"):
            continue
        assert default.exists(), f"{path} without a vars/default.yml to differ from"
        assert yaml.safe_load(path.read_text()) != yaml.safe_load(default.read_text()), f"{path} equals default.yml"


def test_the_role_variable_tables_are_generated_and_current():
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "role_docs.py"), "--check"], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr


def test_role_docs_render_every_option():
    role_docs = _load(REPO / "scripts" / "role_docs.py", "role_docs")
    text = role_docs.render()
    assert "| `nvidia_driver_branch` | str | `580` |" in text
    assert "| `base_kernel_headers` | str, one of `auto`, `true`, `false` | `auto` |" in text
    assert "| `firewall_logging` | str, one of `off`, `low`, `medium`, `high`, `full` | `low` |" in text
    assert "| `firewall_admin_cidr` | str | computed |" in text  # a template in defaults/main.yml, not ""
    assert "| `cluster_cidr` |" in text and "| `pytorch_wheelhouse` |" in text


def test_address_filters():
    net = _load(REPO / "filter_plugins" / "clustercheck_net.py", "clustercheck_net")
    assert net.in_cidr("10.0.0.5", "10.0.0.0/24")
    assert not net.in_cidr("10.0.1.5", "10.0.0.0/24")
    assert net.in_cidr("192.0.2.1", "any")
    assert not net.in_cidr("not-an-address", "10.0.0.0/8")
    assert not net.in_cidr("", "10.0.0.0/8")
    assert net.network_of("172.30.80.11", "255.255.255.0") == "172.30.80.0/24"
    faces = [{"device": "lo", "ipv4": {"address": "127.0.0.1"}}, {"device": "eth0", "ipv4": {"address": "10.0.0.5"}}]
    assert [f["device"] for f in net.interfaces_in_cidr(faces, "10.0.0.0/16")] == ["eth0"]
    # The containers role's refusal: Docker's own default pools (172.17.0.0/16 to 172.31.0.0/16) hold AWS's default VPC;
    # the role's default pool and docker0 (an address with its prefix) stay clear of a 172.30.80.0/24 cluster network.
    assert net.overlaps(["172.16.0.0/12"], ["172.31.0.0/16"]) == ["172.16.0.0/12 overlaps 172.31.0.0/16"]
    assert net.overlaps(["172.17.0.0/16", "172.17.0.1/24"], ["172.30.80.0/24", "any", ""]) == []
    assert net.overlaps(["172.17.0.1/24"], ["172.17.0.0/16"]) == ["172.17.0.1/24 overlaps 172.17.0.0/16"]


def test_container_filter():
    """base (what a container can do) and containers (whether Docker's daemon can run) ask one filter: a container
    is a guest of a container runtime. A VM is a guest too, and a Docker or LXD host is a host."""
    node = _load(REPO / "filter_plugins" / "clustercheck_node.py", "clustercheck_node")
    for kind in ("docker", "podman", "container", "containerd", "lxc", "systemd-nspawn"):
        assert node.is_container({"virtualization_role": "guest", "virtualization_type": kind}), kind
    assert not node.is_container({"virtualization_role": "guest", "virtualization_type": "kvm"})
    assert not node.is_container({"virtualization_role": "host", "virtualization_type": "docker"})
    assert not node.is_container({"virtualization_role": "host", "virtualization_type": "lxc"})
    assert not node.is_container({})  # facts that say nothing: not a container
    roles = [REPO / "roles" / "base" / "tasks" / "main.yml", REPO / "roles" / "containers" / "tasks" / "main.yml"]
    for path in roles:
        text = path.read_text()
        assert "ansible_facts | clustercheck_is_container" in text and "'systemd-nspawn'" not in text, path


def test_the_key_and_repository_sequence_is_written_once():
    """NVIDIA's CUDA repository (nvidia_repo) and the Container Toolkit's (containers) are set up by one task file,
    nvidia_repo's tasks/source.yml: its parameters are its entry point's in the argument specs, each use sets all of
    them, and the keyring is installed only after the fingerprint was read and asserted (the stand-in tests refuse a
    foreign key through both uses)."""
    source = REPO / "roles" / "nvidia_repo" / "tasks" / "source.yml"
    for path in (REPO / "roles").glob("*/tasks/*.yml"):
        if path != source:
            text = path.read_text()
            assert "deb822_repository" not in text and "--show-keys" not in text, f"{path}: a second copy"
    spec = yaml.safe_load((REPO / "roles" / "nvidia_repo" / "meta" / "argument_specs.yml").read_text())
    options = spec["argument_specs"]["source"]["options"]
    tasks = yaml.safe_load(source.read_text())
    role_vars = REPO / "roles" / "nvidia_repo" / "vars" / "main.yml"  # the download's path, made of a parameter
    made_here = {t["register"] for t in tasks if "register" in t} | {v for t in tasks for v in t.get("vars", {})}
    made_here |= set(yaml.safe_load(role_vars.read_text()))
    read = re.findall(r"\bnvidia_repo_source_\w+", source.read_text() + role_vars.read_text())
    assert set(read) - made_here == set(options)
    uses = [
        next(t for t in yaml.safe_load((REPO / "roles" / role / "tasks" / name).read_text()) if key in t)
        for role, name, key in [
            ("nvidia_repo", "main.yml", "ansible.builtin.import_tasks"),
            ("containers", "toolkit.yml", "ansible.builtin.include_role"),
        ]
    ]
    assert uses[0]["ansible.builtin.import_tasks"] == "source.yml"
    assert uses[1]["ansible.builtin.include_role"]["tasks_from"] == "source.yml"
    for use in uses:
        assert set(use["vars"]) == set(options), use["name"]
    names = [t["name"] for t in tasks]
    checked = names.index("NVIDIA repo | ASSERT | The key is NVIDIA's")
    assert "nvidia_repo_source_fprs is not skipped" in tasks[checked]["when"]
    for task in tasks:
        installs = "ansible.builtin.apt" in task and "deb" in task["ansible.builtin.apt"]
        installs |= "--dearmor" in str(task.get("ansible.builtin.command", ""))
        if installs:
            assert names.index(task["name"]) > checked and "nvidia_repo_source_fprs is not skipped" in task["when"]


def test_firewall_removes_only_its_own_rules_that_the_settings_no_longer_ask_for():
    """The firewall role's prune, on what ufw really lists (tests/unit/data/ufw-show-added.txt): admin_cidr narrowed
    from any (and 192.0.2.0/24) to 198.51.100.0/24, the node_exporter rule and the IPv6 SSH rule no longer asked
    for. Rules without the role's comment stay, whatever they allow."""
    rules = _load(REPO / "roles" / "firewall" / "filter_plugins" / "firewall_rules.py", "firewall_rules")
    shown = (REPO / "tests" / "unit" / "data" / "ufw-show-added.txt").read_text()
    wanted = [
        "allow proto tcp from 198.51.100.0/24 to any port 22 comment 'clustercheck SSH'",
        "allow from 172.30.82.0/24 comment 'clustercheck cluster network'",
        "allow 80/tcp",
    ]
    assert rules.stale_rules(shown, wanted, "172.30.82.1", "22") == [
        "allow 22/tcp comment 'clustercheck SSH'",
        "allow from 192.0.2.0/24 to any port 22 proto tcp comment 'clustercheck SSH'",
        "allow from 10.1.0.0/16 to any port 9100 proto tcp comment 'clustercheck node_exporter'",
        "allow from 2001:db8::/32 to any port 22 proto tcp comment 'clustercheck SSH'",
    ]
    # The same settings as when the rules were added (in ufw's own spelling or the role's): nothing to remove.
    same = [
        "allow proto tcp from any to any port 22 comment 'clustercheck SSH'",
        "allow proto tcp from 192.0.2.0/24 to any port 22 comment 'clustercheck SSH'",
        "allow from 172.30.82.0/24 comment 'clustercheck cluster network'",
        "allow proto tcp from 10.1.0.5/16 to any port 9100 comment 'clustercheck node_exporter'",
        "allow from 2001:db8::/32 to any port 22 proto tcp comment 'clustercheck SSH'",
    ]
    assert rules.stale_rules(shown, same, "172.30.82.1", "22") == []
    assert rules.stale_rules("Added user rules (see 'ufw status' for running firewall):\n(None)\n", same) == []
    # The connection the role runs over is never cut: when no wanted rule lets the control machine in, the rules
    # that do stay (the role's guard refuses such settings before this point).
    kept = rules.stale_rules(
        shown, ["allow proto tcp from 198.51.100.0/24 to any port 22 comment 'clustercheck SSH'"], "172.30.82.1", "22"
    )
    assert "allow 22/tcp comment 'clustercheck SSH'" not in kept
    assert "allow from 172.30.82.0/24 comment 'clustercheck cluster network'" not in kept
    assert "allow from 192.0.2.0/24 to any port 22 proto tcp comment 'clustercheck SSH'" in kept


def test_conda_checksum_table_parser():
    script = _load(REPO / "scripts" / "conda_installer_sha256.py", "conda_installer_sha256")
    digest = "2e1ad2188fe69fcdd522c2b20c08c800a5c7411b775eca768318b1540ed32e53"
    assert script.parse_sha256_file(f"{digest}  Miniforge3-24.11.3-0-Linux-x86_64.sh\n") == digest
    with pytest.raises(ValueError):
        script.parse_sha256_file("Not Found")
    assert script.installer_names("24.11.3-0")[0] == "Miniforge3-24.11.3-0-Linux-x86_64.sh"
    defaults = yaml.safe_load((REPO / "roles" / "python_env" / "defaults" / "main.yml").read_text())
    assert defaults["python_env_conda_installer_sha256"]["Miniforge3-24.11.3-0-Linux-x86_64.sh"] == digest


def test_wheelhouse_check_reads_real_wheel_names():
    """python_env's wheel check on the wheel names pip downloads for torch 2.13.0 CPU (CPython 3.11, x86_64)."""
    wheels = _load(REPO / "roles" / "python_env" / "filter_plugins" / "python_env_wheels.py", "python_env_wheels")
    names = [
        "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl",
        "markupsafe-3.0.4-cp311-cp311-manylinux2014_x86_64.manylinux_2_17_x86_64.manylinux_2_28_x86_64.whl",
        "mpmath-1.3.0-py3-none-any.whl",
    ]
    assert wheels.wheelhouse_mismatch(names, {"torch": "2.13.0"}, "3.11", "x86_64") == ""
    assert wheels.wheelhouse_mismatch(names, {"torch": "", "mpmath": "1.3.0"}, "3.8", "x86_64") == ""
    assert wheels.wheelhouse_mismatch(names, {"torch": "2.13.0"}, "3.12", "x86_64", "gpu01") == (
        "gpu01 has Python 3.12 on x86_64, but the wheelhouse's torch==2.13.0 wheels are for "
        "cp311-cp311-manylinux_2_28_x86_64; build a wheelhouse for it with: pip download -d wheelhouse "
        "--only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 torch==2.13.0"
    )
    assert "--platform manylinux_2_28_aarch64" in wheels.wheelhouse_mismatch(
        names, {"torch": "2.13.0"}, "3.11", "aarch64"
    )
    assert wheels.wheelhouse_mismatch(names, {"torchvision": "0.28.0"}, "3.11", "x86_64").startswith(
        "the wheelhouse has no torchvision==0.28.0 wheel"
    )
    assert wheels.python_too_old("3.8", "3.10") and not wheels.python_too_old("3.12", "3.10")


def _requirements(**settings) -> list[str]:
    """python_env's requirements.txt for the role's defaults with SETTINGS, rendered by Jinja (the template needs no
    more of Ansible than its bool filter)."""
    import jinja2

    role = REPO / "roles" / "python_env"
    values = yaml.safe_load((role / "defaults" / "main.yml").read_text())
    values.update(python_env_pytorch_variant="cpu", python_env_pytorch_index_url="https://download.pytorch.org/whl/cpu")
    values.update(python_env_wheelhouse="")  # the computed defaults, as they come out with no GPU and no wheelhouse
    values.update(ansible_managed="managed", **settings)
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(role / "templates"), trim_blocks=True)
    env.filters["bool"] = lambda value: str(value).lower() in ("true", "yes", "1")
    text = env.get_template("requirements.txt.j2").render(values)
    return [line for line in text.splitlines() if line and not line.startswith(("#", "-"))]


def test_the_default_environment_manager_is_the_one_the_test_clusters_converge():
    """venv: the test clusters converge the role's default (their variables leave the manager alone); conda's
    installer cannot be reached from them, so conda, the other choice, is run in check mode only."""
    defaults = yaml.safe_load((REPO / "roles" / "python_env" / "defaults" / "main.yml").read_text())
    assert defaults["python_env_manager"] == _options("python_env")["python_env_manager"]["default"] == "venv"
    for name in ("testcluster-vars.yml", "testcluster-ubuntu-hostvars.yml"):
        assert "python_env_manager" not in (REPO / "tests" / "ansible" / name).read_text(), name
    example = yaml.safe_load((REPO / "inventory" / "group_vars" / "all.yml").read_text())
    assert example["python_env_manager"] == "venv"


def test_numpy_is_installed_with_torch_at_its_pin():
    """Without numpy, torch's object collectives (dist.all_gather_object) fail on every rank with "Numpy is not
    available": it comes with torch, pinned, from an index or a wheelhouse; without torch there is none."""
    assert _requirements() == ["torch==2.13.0+cpu", "numpy==2.2.6", "torchvision==0.28.0+cpu"]
    assert _requirements(python_env_wheelhouse="/srv/wheels", python_env_torchvision_version="") == [
        "torch==2.13.0",
        "numpy==2.2.6",
    ]
    assert _requirements(python_env_torch_version="", python_env_packages=["mpmath==1.3.0"]) == [
        "torchvision==0.28.0+cpu",
        "mpmath==1.3.0",
    ]
    assert "numpy" not in " ".join(_requirements(python_env_numpy_version=""))
    # The wheelhouse is checked for numpy like torch, and the environment must import it (tasks/main.yml).
    tasks = (REPO / "roles" / "python_env" / "tasks" / "main.yml").read_text()
    assert "'numpy': python_env_numpy_version" in tasks and "(['numpy'] if python_env_numpy_wanted" in tasks


def test_the_monitoring_timer_offers_the_stages_clustercheck_runs():
    """monitoring_timer_stages become `clustercheck run --only` arguments: its choices are the CLI's stages."""
    from clustercheck.commands import cli

    only = next(p for p in cli.commands["run"].params if p.name == "only")
    assert _options("monitoring")["monitoring_timer_stages"]["choices"] == list(only.type.choices)


def test_a_task_delegated_to_the_control_machine_never_becomes_root_there():
    """Under Mitogen (ansible.cfg) a task delegated to localhost takes the nodes' inventory ansible_become, not the
    task's `become: false`, and would run sudo on the control machine: each such task sets `ansible_become: false` as
    a task variable, which both strategies read."""
    from test_role_tags import tasks_of

    delegated = [
        (f"roles/{role}/tasks/{name}: {task.get('name')}", task)
        for role in ROLES
        for name, task, _ in tasks_of(role)
        if task.get("delegate_to") == "localhost"
    ]
    assert len(delegated) >= 2, delegated  # the wheelhouse's packing and clustercheck's wheel build at least
    for where, task in delegated:
        assert (task.get("vars") or {}).get("ansible_become") is False, f"{where} does not set ansible_become: false"
