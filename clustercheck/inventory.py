"""Which nodes to check, and how to reach them.

`--hosts` is an Ansible inventory (read through `ansible-inventory --list`, the
documented JSON shape), a comma-separated list (`node1,user@node2:2222`), or
`localhost`. One inventory drives both setup and verification: the variables
the roles use (the environment's python, GPUs per node, the cluster interface)
are read here.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clustercheck import sshoptions

LOCAL_NAMES = {"localhost", "127.0.0.1", "::1"}

# Group and host variables clustercheck reads, besides Ansible's connection variables.
PYTHON_VAR = "clustercheck_python"  # the environment's python (else /etc/clustercheck/python, else python3)
GPUS_VAR = "gpus_per_node"  # GPUs expected on each node (0: none; unset: whatever is there)
INTERFACE_VAR = "cluster_interface"  # the interface nodes talk to each other on
RAILS_VAR = "cluster_rail_interfaces"  # the data networks training uses: local rank i binds item i mod len
MIN_BUSBW_VAR = "clustercheck_min_busbw"  # all_reduce busbw threshold, FAIL[:WARN] in GB/s (like --min-busbw)
DATA_PATHS_VAR = "clustercheck_data_paths"  # paths that must hold the same data on every node (like --data-path)
CIDR_VAR = "cluster_cidr"  # the cluster network, used to find the interface when none is named
PACKAGES_VAR = "python_env_packages"  # the user's pip packages (requirement specifiers) the python_env role installs
EXPECT_TRANSPORT_VAR = "clustercheck_expect_transport"  # ib, roce or socket: what NCCL must use between nodes
EXPECTED_FILE_VAR = "clustercheck_expected_file"  # the user's expected values per GPU model (like --expected)
XID_ACTIONS_VAR = "clustercheck_xid_actions"  # the site's action per Xid code, {63: none}, over the catalog's
# What to do about an Xid, least to most (checks/xid_catalog.py words them; here since a site's setting names them).
XID_ACTIONS = ("none", "restart_app", "update_swfw", "reset_gpu", "reboot", "contact_support", "drain_inspect")
TRANSPORTS = ("ib", "roce", "socket")
SETUP_GROUP = "gpu_nodes"  # the group site.yml's plays set up (playbooks/nodes.yml)
READ_VARS = (
    "ansible_host",
    "ansible_port",
    "ansible_user",
    "ansible_ssh_private_key_file",
    "ansible_connection",
    "ansible_ssh_args",
    "ansible_ssh_common_args",
    "ansible_ssh_extra_args",
    PYTHON_VAR,
    GPUS_VAR,
    INTERFACE_VAR,
    RAILS_VAR,
    CIDR_VAR,
    DATA_PATHS_VAR,
    EXPECT_TRANSPORT_VAR,
    EXPECTED_FILE_VAR,
    XID_ACTIONS_VAR,
)


class InventoryError(Exception):
    """The inventory cannot be used; the message says why, in one line."""


@dataclass
class Node:
    """One host to check, and everything needed to reach it."""

    name: str
    address: str
    port: int | None = None  # None: from ~/.ssh/config, else 22
    user: str | None = None  # None: from ~/.ssh/config, else the local user
    key_file: str | None = None
    connection: str = "ssh"  # "ssh" or "local"
    python: str | None = None  # None: /etc/clustercheck/python on the node, else python3
    gpus_expected: int | None = None  # None: not stated; GPU checks skip on a node without GPUs
    cluster_interface: str | None = None
    rail_interfaces: tuple[str, ...] = ()  # cluster_rail_interfaces
    cluster_cidr: str | None = None
    min_busbw: str | None = None  # clustercheck_min_busbw
    data_paths: tuple[str, ...] = ()  # clustercheck_data_paths
    packages: tuple[str, ...] = ()  # distribution names from python_env_packages: they must import on the node
    expect_transport: str | None = None  # clustercheck_expect_transport
    expected_file: str | None = None  # clustercheck_expected_file
    xid_actions: dict[int, str] = field(default_factory=dict)  # clustercheck_xid_actions: {code: action}
    ssh_options: dict[str, str] = field(default_factory=dict)  # the options ansible_ssh_*args set (sshoptions.py)
    ssh_config_file: str | None = None  # the -F file ansible_ssh_*args name: read instead of ~/.ssh/config
    firewall_role: bool = False  # site.yml's firewall role manages ufw here (firewall_managed)

    @property
    def is_local(self) -> bool:
        return self.connection == "local"


def load(spec: str, limit: str | None = None) -> list[Node]:
    """Nodes named by --hosts SPEC, narrowed by --limit; an empty result is the caller's to report."""
    spec = spec.strip()
    if not spec:
        raise InventoryError("--hosts is empty")
    if os.path.exists(spec):
        nodes = from_ansible_list(_ansible_inventory_list(spec), limit)
    elif "/" in spec or spec.endswith((".ini", ".yml", ".yaml")):
        raise InventoryError(f"--hosts {spec}: no such inventory file or directory")
    else:
        nodes = select(parse_host_list(spec), limit)
    return nodes


# The variables that hold one value for the whole cluster, and the Node field each is read into.
CLUSTER_VARS = {MIN_BUSBW_VAR: "min_busbw", DATA_PATHS_VAR: "data_paths", EXPECTED_FILE_VAR: "expected_file"}


def cluster_value(nodes: list[Node], var: str) -> Any:
    """The value of VAR (one of CLUSTER_VARS) the NODES agree on: None (or ()) when none sets it, the one value when
    those that set it set the same; InventoryError naming the nodes and their values when they set different ones
    (a run has one threshold, one set of data paths, one file of expected values)."""
    field_name = CLUSTER_VARS[var]
    by_value: dict[Any, list[str]] = {}
    for node in nodes:
        value = getattr(node, field_name)
        if value not in (None, "", ()):
            by_value.setdefault(value, []).append(node.name)
    if len(by_value) > 1:
        said = "; ".join(
            f"{', '.join(names)}: {','.join(value) if isinstance(value, tuple) else value}"
            for value, names in by_value.items()
        )
        raise InventoryError(
            f"{var} differs between the nodes ({said}): it is one value for the whole cluster, set it once "
            "(in the all group, or in a group holding every node)"
        )
    return next(iter(by_value), getattr(Node("", ""), field_name))


def parse_host_list(spec: str) -> list[Node]:
    """`node1,user@node2:2222,[fe80::1]:22,localhost` -> nodes, in the order given."""
    nodes = []
    for item in (part.strip() for part in spec.split(",")):
        if not item:
            continue
        user = None
        if "@" in item:
            user, item = item.rsplit("@", 1)
            if not user:
                raise InventoryError(f"--hosts: empty user name in {item!r}")
        host, port = item, None
        if item.startswith("["):
            host, _, rest = item[1:].partition("]")
            if rest:
                port = _port(rest.removeprefix(":"), item)
        elif item.count(":") == 1:
            host, port_text = item.split(":")
            port = _port(port_text, item)
        if not host:
            raise InventoryError(f"--hosts: no host name in {item!r}")
        local = host in LOCAL_NAMES and port is None and user is None
        nodes.append(Node(name=host, address=host, port=port, user=user, connection="local" if local else "ssh"))
    if not nodes:  # only commas and spaces: a list that names nothing is a mistake, not a filter that matched none
        raise InventoryError(f"--hosts {spec.strip()!r} names no host (a comma-separated list: node1,node2)")
    names = [n.name for n in nodes]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise InventoryError(f"--hosts names {', '.join(duplicates)} more than once")
    return nodes


def _port(text: str, item: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise InventoryError(f"--hosts: bad port in {item!r}")
    return int(text)


def _ansible_inventory_list(path: str) -> dict[str, Any]:
    tool = shutil.which("ansible-inventory") or str(Path(sys.executable).parent / "ansible-inventory")
    if not os.path.exists(tool):
        raise InventoryError("reading an Ansible inventory needs ansible-inventory (pip install ansible-core)")
    try:
        proc = subprocess.run(
            [tool, "-i", path, "--list"],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "ANSIBLE_INVENTORY_UNPARSED_WARNING": "False"},
        )
    except subprocess.TimeoutExpired as exc:
        raise InventoryError(f"ansible-inventory -i {path} did not answer within 120 s") from exc
    warnings = [
        line.strip()
        for line in proc.stderr.splitlines()
        if "Unable to parse" in line or "ERROR" in line or "Failed to parse" in line
    ]
    if proc.returncode != 0 or warnings:
        detail = (warnings or proc.stderr.strip().splitlines() or ["no output"])[0]
        raise InventoryError(f"inventory {path}: {detail.removeprefix('[WARNING]: ').removeprefix('ERROR! ')}")
    try:
        return json.loads(proc.stdout)
    except ValueError as exc:
        raise InventoryError(f"inventory {path}: ansible-inventory printed no JSON") from exc


def from_ansible_list(data: dict[str, Any], limit: str | None = None) -> list[Node]:
    """Nodes from `ansible-inventory --list` JSON, in the order Ansible lists them."""
    groups = _group_hosts(data)
    hostvars = data.get("_meta", {}).get("hostvars", {})
    ordered = list(dict.fromkeys(groups.get("all", [])))
    for name in hostvars:
        if name not in ordered:
            ordered.append(name)
    selected = _match(ordered, groups, limit)
    nodes = [node_from_vars(name, hostvars.get(name, {})) for name in selected]
    for node in nodes:
        node.firewall_role = firewall_managed(node.name, groups, hostvars.get(node.name, {}))
    return nodes


def firewall_managed(name: str, groups: dict[str, list[str]], hostvars: dict[str, Any]) -> bool:
    """Whether site.yml's firewall role manages NAME's firewall: the node is in SETUP_GROUP, the group site.yml
    sets up (playbooks/nodes.yml), and firewall_enabled (the role's switch, true by default) is not false."""
    enabled = hostvars.get("firewall_enabled", True)
    off = enabled is False or str(enabled).strip().lower() in ("false", "no", "0", "off")
    return name in groups.get(SETUP_GROUP, []) and not off


def _group_hosts(data: dict[str, Any]) -> dict[str, list[str]]:
    """Group name -> every host in it, children included (the `all` group holds every host)."""
    resolved: dict[str, list[str]] = {}

    def hosts_of(group: str, seen: tuple[str, ...] = ()) -> list[str]:
        if group in resolved:
            return resolved[group]
        entry = data.get(group, {}) if isinstance(data.get(group), dict) else {}
        hosts = list(entry.get("hosts", []))
        for child in entry.get("children", []):
            if child not in seen:
                hosts += hosts_of(child, (*seen, group))
        resolved[group] = list(dict.fromkeys(hosts))
        return resolved[group]

    for group in data:
        if group != "_meta":
            hosts_of(group)
    hosts_of("all")
    return resolved


def select(nodes: list[Node], limit: str | None) -> list[Node]:
    by_name = {n.name: n for n in nodes}
    return [by_name[name] for name in _match(list(by_name), {"all": list(by_name)}, limit)]


def _match(hosts: list[str], groups: dict[str, list[str]], limit: str | None) -> list[str]:
    """Ansible-style --limit: comma- or colon-separated groups, hosts or globs; `!x` excludes, `&x` intersects."""
    if not limit:
        return hosts
    include: set[str] = set()
    patterns = [p for p in limit.replace(":", ",").split(",") if p.strip()]
    if all(p.strip().startswith(("!", "&")) for p in patterns):
        include = set(hosts)
    for raw in patterns:
        pattern = raw.strip()
        kind = pattern[0] if pattern[0] in "!&" else "+"
        pattern = pattern.lstrip("!&")
        matched = set(groups.get(pattern, [])) | {h for h in hosts if fnmatch.fnmatchcase(h, pattern)}
        for group, members in groups.items():
            if group != pattern and any(c in pattern for c in "*?[") and fnmatch.fnmatchcase(group, pattern):
                matched |= set(members)
        if kind == "+":
            include |= matched
        elif kind == "!":
            include -= matched
        else:
            include &= matched
    return [h for h in hosts if h in include]


def node_from_vars(name: str, hostvars: dict[str, Any]) -> Node:
    """One node from its Ansible host variables."""
    for var in READ_VARS:
        _refuse_unusable(name, var, hostvars.get(var))
    address = str(hostvars.get("ansible_host") or name)
    connection = str(hostvars.get("ansible_connection") or "ssh")
    if connection in ("ssh", "paramiko", "smart"):
        connection = "ssh"
    elif connection != "local":
        raise InventoryError(f"{name}: ansible_connection={connection} is not supported (use ssh or local)")
    port = hostvars.get("ansible_port")
    gpus = hostvars.get(GPUS_VAR)
    try:
        port = int(port) if port not in (None, "") else None
        gpus = int(gpus) if gpus not in (None, "") else None
    except (TypeError, ValueError) as exc:
        raise InventoryError(f"{name}: ansible_port and {GPUS_VAR} must be whole numbers") from exc
    args = ssh_arguments(name, hostvars)
    return Node(
        name=name,
        address=address,
        port=port,
        user=_text(hostvars.get("ansible_user")),
        key_file=_text(hostvars.get("ansible_ssh_private_key_file")),
        connection=connection,
        python=_text(hostvars.get(PYTHON_VAR)),
        gpus_expected=gpus,
        cluster_interface=_text(hostvars.get(INTERFACE_VAR)),
        rail_interfaces=_rails(name, hostvars.get(RAILS_VAR)),
        cluster_cidr=_text(hostvars.get(CIDR_VAR)),
        min_busbw=_text(hostvars.get(MIN_BUSBW_VAR)),
        data_paths=_paths(name, hostvars.get(DATA_PATHS_VAR)),
        packages=distributions(name, hostvars.get(PACKAGES_VAR)),
        expect_transport=_transport(name, hostvars.get(EXPECT_TRANSPORT_VAR)),
        expected_file=_text(hostvars.get(EXPECTED_FILE_VAR)),
        xid_actions=_xid_actions(name, hostvars.get(XID_ACTIONS_VAR)),
        ssh_options=args.options,
        ssh_config_file=args.config_file,
    )


def _paths(name: str, value: Any) -> tuple[str, ...]:
    """A list of paths, or one string of comma-separated paths."""
    if value in (None, ""):
        return ()
    if isinstance(value, str):
        value = value.split(",")
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InventoryError(f"{name}: {DATA_PATHS_VAR} must be a list of paths")
    return tuple(v.strip() for v in value if v.strip())


def _rails(name: str, value: Any) -> tuple[str, ...]:
    """cluster_rail_interfaces: a list of interface names (or one comma-separated string)."""
    if value in (None, "", []):
        return ()
    if isinstance(value, str):
        value = value.split(",")
    names = [v.strip() for v in value if isinstance(v, str) and v.strip()] if isinstance(value, list) else []
    if not names or len(names) != len(value) or any(not re.fullmatch(r"[A-Za-z0-9_.:@-]{1,15}", n) for n in names):
        raise InventoryError(f"{name}: {RAILS_VAR} must be a list of interface names, e.g. [ib0, ib1] or [eth1, eth2]")
    return tuple(names)


def distributions(name: str, specifiers: Any) -> tuple[str, ...]:
    """Distribution names of requirement specifiers (`lightning==2.5.1`, `numpy>=1.26`, `pkg[extra]`)."""
    if specifiers in (None, ""):
        return ()
    if not isinstance(specifiers, list):
        raise InventoryError(f"{name}: {PACKAGES_VAR} must be a list of requirement specifiers")
    names = []
    for spec in specifiers:
        match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", str(spec))
        if match and "{{" not in str(spec):
            names.append(match[1])
    return tuple(names)


def _text(value: Any) -> str | None:
    return str(value) if value not in (None, "") else None


def _refuse_unusable(name: str, var: str, value: Any) -> None:
    if isinstance(value, dict) and "__ansible_vault" in value:
        raise InventoryError(f"{name}: {var} is vaulted; clustercheck does not decrypt vaults, set it in plain text")
    if isinstance(value, str) and ("{{" in value or "{%" in value):
        raise InventoryError(
            f"{name}: {var} is a template ({value}); clustercheck does not render templates, set a plain value"
        )


# The variables whose words Ansible's ssh connection puts on ssh's command line, in its order (ansible_ssh_args in
# place of ansible.cfg's ssh_args, then the common, then the extra ones): the first value of an option wins.
SSH_ARG_VARS = ("ansible_ssh_args", "ansible_ssh_common_args", "ansible_ssh_extra_args")


def ssh_arguments(name: str, hostvars: dict[str, Any]) -> sshoptions.SshArgs:
    """The ssh options and -F file NAME's ansible_ssh_*args give, read as ssh reads its command line."""
    merged = sshoptions.SshArgs()
    for var in SSH_ARG_VARS:
        try:
            parsed = sshoptions.parse_args(str(hostvars.get(var) or ""))
        except sshoptions.ArgumentError as exc:
            raise InventoryError(f"{name}: {var}: {exc}") from exc
        for key, value in parsed.options.items():
            merged.set(key, value)
        merged.config_file = merged.config_file or parsed.config_file
    return merged


def parse_ssh_options(args: str, name: str = "") -> dict[str, str]:
    """The options ssh's arguments ARGS set (`-o Key=Value`, -J, -i, -p, -l...), keys lower-cased as in ssh_config."""
    return ssh_arguments(name, {"ansible_ssh_common_args": args}).options


def _transport(name: str, value: Any) -> str | None:
    text = _text(value)
    if text is not None and text.lower() not in TRANSPORTS:
        raise InventoryError(f"{name}: {EXPECT_TRANSPORT_VAR} is {text!r}, not one of {', '.join(TRANSPORTS)}")
    return text.lower() if text else None


def _xid_actions(name: str, value: Any) -> dict[int, str]:
    """A site's action per Xid code, {63: "none", 92: "drain_inspect"} (a YAML or JSON mapping, its keys numbers or
    digit strings) or "63:none,92:drain_inspect" (an INI inventory's string): {code: action}; InventoryError in one
    line naming the node and the first bad entry."""
    if value in (None, ""):
        return {}
    if isinstance(value, str):
        pairs = [tuple(part.partition(":")[::2]) for part in value.split(",") if part.strip()]
    elif isinstance(value, dict):
        pairs = list(value.items())
    else:
        raise InventoryError(f"{name}: {XID_ACTIONS_VAR} must map Xid codes to actions, e.g. {{63: none}}")
    actions = {}
    for code, action in pairs:
        text, word = str(code).strip(), str(action).strip().lower()
        if not text.isdigit():
            raise InventoryError(f"{name}: {XID_ACTIONS_VAR}: {text!r} is not an Xid code (a whole number)")
        if word not in XID_ACTIONS:
            known = ", ".join(XID_ACTIONS)
            raise InventoryError(f"{name}: {XID_ACTIONS_VAR}: Xid {text}: {word!r} is not one of {known}")
        actions[int(text)] = word
    return actions
