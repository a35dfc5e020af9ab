"""The configuration files site.yml's roles write, as data, and their reading on a node (the facts collector's
`managed_files` probe). Standard library only (Python 3.8).

Every file a role writes (its tasks' `template:`, `copy:`, `blockinfile:`, `lineinfile:`, `replace:` destinations)
is either in MANAGED, with the role (and tag) whose re-run puts it back, or in LEFT_OUT with why it is not compared;
tests/unit/test_managed_files.py reads roles/*/tasks and fails on a destination named in neither. The controller
compares each file's copies across the nodes (checks/drift.py, `consistency.files`).

On the node, a file is read once, bounded: its SHA-256 and size always, its text only where it may be shown (small,
readable by everyone, not key-like: a secret is compared by its hash alone and never leaves the node), for a block
a role manages inside a file of the site's (/etc/hosts) only that block. A file that does not exist is not in the
answer: a role not used on any node is no finding.
"""

from __future__ import annotations

import glob
import hashlib
import os
import re
import sys

TEXT = "text"  # compared by content; the lines that differ are shown
SECRET = "secret"  # compared by SHA-256 only, never sent (a key)
BLOCK = "block"  # only the block between the role's markers (blockinfile's "# BEGIN ..." / "# END ...")

SHOWN_LIMIT = 32_000  # bytes: a larger file is compared by its hash, its text not sent
READ_LIMIT = 4_000_000  # bytes hashed at most (a file the roles write is far smaller)
KEY_LIKE = re.compile(r"(^|[/_.-])(key|keys|secret|token|password|id_[a-z0-9]+)($|[/_.-])", re.I)


class Managed:
    """A file a role writes: PATH on the node (a glob; "{env}" is the environment's prefix, "~" the home of the user
    clustercheck runs as), ROLE the role and tag of site.yml that writes it, WRITES the destination exactly as the
    role's task writes it, KIND how it is compared, MARKER the role's blockinfile marker for a BLOCK, TAG the tag of
    site.yml that re-runs it (the role's own, or for a role other roles include, the first of those), VARIES the lines
    (a regular expression) the role writes per node by design, from variables a site sets per host: left out of the
    comparison, each with why (VARIED_BY)."""

    __slots__ = ("kind", "marker", "path", "role", "tag", "varies", "writes")

    def __init__(self, path, role, writes, kind=TEXT, marker=None, tag=None, varies=None):
        self.path, self.role, self.writes, self.kind, self.marker = path, role, writes, kind, marker
        self.tag = tag or role
        self.varies = re.compile(varies) if varies else None

    def __repr__(self):
        return f"Managed({self.path!r}, {self.role!r})"


SLURM_CONF = "{{ slurm_conf_path | dirname }}/{{ item }}"  # slurm.conf, gres.conf and cgroup.conf (where written)

MANAGED = (
    Managed("/etc/slurm*/slurm.conf", "slurm", SLURM_CONF),  # /etc/slurm, or /etc/slurm-llnl on older Debian
    Managed("/etc/slurm*/gres.conf", "slurm", SLURM_CONF),
    Managed("/etc/slurm*/cgroup.conf", "slurm", SLURM_CONF),
    Managed("/etc/munge/munge.key", "slurm", "{{ slurm_munge_key }}", SECRET),
    Managed("/usr/local/sbin/clustercheck-slurm-health", "slurm", "{{ slurm_health_program }}"),
    Managed("/usr/local/sbin/clustercheck-slurm-epilog", "slurm", "{{ slurm_epilog_program }}"),
    Managed("/usr/local/sbin/clustercheck-slurm-prolog", "slurm", "{{ slurm_prolog_program }}"),
    Managed("/etc/clustercheck/slurm-restart.conf", "slurm", "{{ slurm_restart_stamp }}"),
    Managed("/etc/chrony/chrony.conf", "base", "/etc/chrony/chrony.conf", varies=r"^(server|pool|allow|local)\s"),
    Managed(
        "/etc/systemd/system/chrony.service.d/clustercheck.conf",
        "base",
        "/etc/systemd/system/chrony.service.d/clustercheck.conf",
    ),
    Managed("/etc/security/limits.d/90-clustercheck.conf", "base", "/etc/security/limits.d/90-clustercheck.conf"),
    Managed(
        "/etc/systemd/system.conf.d/90-clustercheck.conf", "base", "/etc/systemd/system.conf.d/90-clustercheck.conf"
    ),
    Managed("/etc/sysctl.d/90-clustercheck.conf", "base", "/etc/sysctl.d/90-clustercheck.conf"),
    Managed("/etc/hosts", "cluster_hosts", "/etc/hosts", BLOCK, "# {mark} clustercheck cluster_hosts"),
    Managed("/etc/cloud/templates/hosts.*.tmpl", "cluster_hosts", "{{ cluster_hosts_cloud_init_hosts_template }}"),
    Managed("/etc/nccl.conf", "cluster_hosts", "/etc/nccl.conf", varies=r"^NCCL_SOCKET_IFNAME="),
    Managed(
        "/etc/profile.d/clustercheck-network.sh",
        "cluster_hosts",
        "/etc/profile.d/clustercheck-network.sh",
        varies=r"^export (NCCL|GLOO)_SOCKET_IFNAME=",
    ),
    Managed("/etc/docker/daemon.json", "containers", "/etc/docker/daemon.json"),
    Managed("/etc/profile.d/clustercheck-cuda.sh", "cuda_toolkit", "/etc/profile.d/clustercheck-cuda.sh"),
    Managed("/etc/default/prometheus-node-exporter", "monitoring", "{{ monitoring_environment_file }}"),
    Managed("/etc/modprobe.d/blacklist-nouveau.conf", "nvidia_driver", "/etc/modprobe.d/blacklist-nouveau.conf"),
    Managed(
        "/etc/apt/preferences.d/clustercheck-nvidia-driver",
        "nvidia_driver",
        "/etc/apt/preferences.d/clustercheck-nvidia-driver",
    ),
    Managed(
        "/etc/modules-load.d/clustercheck-nvlsm.conf", "nvidia_driver", "/etc/modules-load.d/clustercheck-nvlsm.conf"
    ),
    Managed(
        "/etc/systemd/system/nvidia-persistenced.service.d/clustercheck-persistence-mode.conf",
        "nvidia_driver",
        "/etc/systemd/system/nvidia-persistenced.service.d/clustercheck-persistence-mode.conf",
    ),
    Managed(
        "/etc/apt/preferences.d/cuda-repository-pin-600",
        "nvidia_repo",
        "/etc/apt/preferences.d/cuda-repository-pin-600",
        tag="nvidia_driver",  # nvidia_repo runs inside nvidia_driver, cuda_toolkit and nccl, under their tags
    ),
    Managed("/opt/conda/.condarc", "python_env", "{{ python_env_conda_prefix }}/.condarc"),
    Managed(
        "/etc/clustercheck/envs/*/environment.yml",
        "python_env",
        "/etc/clustercheck/envs/{{ python_env_name }}/environment.yml",
    ),
    # The environment's own record of what it was built from: the package list the role installed.
    Managed("{env}/requirements.txt", "python_env", "{{ python_env_dir }}/requirements.txt"),
    Managed("{env}/.clustercheck-spec", "python_env", "{{ python_env_dir }}/.clustercheck-spec"),
    Managed("/etc/clustercheck/python", "python_env", "{{ python_env_record_path }}"),
    Managed("~/.ssh/id_cluster_ed25519", "ssh_trust", "{{ ssh_trust_ssh_dir }}/{{ item.item }}", SECRET),
    Managed("~/.ssh/id_cluster_ed25519.pub", "ssh_trust", "{{ ssh_trust_ssh_dir }}/{{ item.item }}"),
    Managed(
        "/etc/ssh/ssh_known_hosts",
        "ssh_trust",
        "{{ ssh_trust_known_hosts_file }}",
        BLOCK,
        "# {mark} clustercheck ssh_trust",
    ),
    Managed("/etc/ssh/ssh_config.d/50-clustercheck.conf", "ssh_trust", "{{ ssh_trust_client_config }}"),
)

# Why the lines of VARIES differ between nodes by design (tests/unit/test_managed_files.py: one for each).
VARIED_BY = {
    "/etc/chrony/chrony.conf": "a node that serves time to the others (base_chrony_allow, base_chrony_local_stratum) "
    "has other sources (server, pool) than its clients",
    "/etc/nccl.conf": "the cluster interface's name, which differs between kinds of machine "
    "(cluster_hosts_net_interface)",
    "/etc/profile.d/clustercheck-network.sh": "the cluster interface's name (cluster_hosts_net_interface)",
}

# (role, destination as its task writes it) -> why the file is not compared across the nodes.
LEFT_OUT = {
    ("base", "/etc/fstab"): "each node's own file systems; the role's /dev/shm line is what shm.size checks",
    ("cluster_hosts", "/etc/environment"): "the site's own lines beside the role's one, which env.launch reads",
    ("monitoring", "{{ monitoring_timer_inventory }}"): "written on the one node that runs the timer",
    ("monitoring", "/etc/systemd/system/{{ item }}"): "the timer's units, on the one node that runs the timer",
    ("nvidia_driver", "/usr/sbin/policy-rc.d"): "there only while the driver installs, removed after",
    ("python_env", "/var/cache/clustercheck/{{ python_env_conda_installer }}"): "an installer, checked by its checksum",
    ("ssh_trust", "{{ ssh_trust_ssh_dir }}/authorized_keys"): "each user's own keys beside the cluster key's line",
    ("wheelhouse", "{{ wheelhouse_dest }}.tar"): "an archive of wheels, whose packages consistency.packages compares",
}

# Slurm's own word on a node whose slurm.conf differs from the controller's: slurmctld logs it when the node registers
# (SchedMD/slurm, src/slurmctld/proc_req.c, _slurm_rpc_node_registration: "Node %s appears to have a different
# slurm.conf than the slurmctld. ..."), unless DebugFlags=NO_CONF_HASH.
SLURM_HASH_MARK = "appears to have a different slurm.conf"
LOG_FILE = re.compile(r"^\s*SlurmctldLogFile\s*=\s*(\S+)", re.M | re.I)
LOG_TAIL = 256_000  # bytes of slurmctld's log read, from its end
LOG_LINES = 20


def expand(pattern, prefix=None, home=None):
    """The paths PATTERN names on this node, sorted."""
    prefix = sys.prefix if prefix is None else prefix
    home = os.path.expanduser("~") if home is None else home
    path = pattern.replace("{env}", prefix)
    if path.startswith("~/"):
        path = home + path[1:]
    return sorted(glob.glob(path))


def block(text, marker):
    """The lines between MARKER's BEGIN and END lines (blockinfile's), or None where the block is not there."""
    begin, end = marker.replace("{mark}", "BEGIN"), marker.replace("{mark}", "END")
    lines = text.splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if line.rstrip("\r\n") == begin]
    if not starts:
        return None
    inside = lines[starts[0] + 1 :]
    ends = [i for i, line in enumerate(inside) if line.rstrip("\r\n") == end]
    return "".join(inside[: ends[0]] if ends else inside)


def shown(path, kind, mode):
    """Whether PATH's text may leave the node: not a SECRET, not key-like by name, readable by everyone (a file a role
    made readable by its owner only is a secret)."""
    return kind != SECRET and not KEY_LIKE.search(os.path.basename(path)) and bool(mode & 0o004)


def read(path, entry):
    """One file: {"sha256", "size", "text" (where it may be shown)} of what is compared (a BLOCK's lines, the file
    without the lines that vary by design), {"error"} when it cannot be read, None when a BLOCK's markers are not in
    it."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(READ_LIMIT)
        mode = os.stat(path).st_mode
    except OSError as exc:
        return {"error": f"{type(exc).__name__}: {exc.strerror or exc}"}
    if entry.kind == BLOCK:
        text = block(data.decode("utf-8", "replace"), entry.marker)
        if text is None:
            return None
        data = text.encode()
    varied = 0
    if entry.varies is not None:  # what is compared: the lines the role writes the same on every node
        lines = data.decode("utf-8", "replace").splitlines(keepends=True)
        kept = [line for line in lines if not entry.varies.search(line)]
        varied, data = len(lines) - len(kept), "".join(kept).encode()
    answer = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    if varied:
        answer["varied_lines"] = varied
    if len(data) <= SHOWN_LIMIT and shown(path, entry.kind, mode):
        answer["text"] = data.decode("utf-8", "replace")
    return answer


def slurm_hash_lines(files, root=""):
    """The last lines of slurmctld's log (where this node has it: the controller) that say a node's slurm.conf
    differs from slurmctld's; the log is where slurm.conf's SlurmctldLogFile names it."""
    conf = next((f for path, f in files.items() if path.endswith("/slurm.conf") and "text" in f), None)
    found = LOG_FILE.search(conf["text"]) if conf else None
    if not found:
        return []
    try:
        with open(root + found.group(1), "rb") as fh:
            fh.seek(max(0, os.fstat(fh.fileno()).st_size - LOG_TAIL))
            tail = fh.read().decode("utf-8", "replace")
    except OSError:
        return []
    return [line for line in tail.splitlines() if SLURM_HASH_MARK in line][-LOG_LINES:]


def managed_files(root="", prefix=None, home=None):
    """Every managed file present on this node, by path: {"files": {path: {"role", "sha256", ...}}, "slurmctld":
    [slurmctld's log lines on a differing slurm.conf]}. ROOT: the directory the paths are under (a test's copy of
    a node's files), PREFIX and HOME what "{env}" and "~" stand for (this python's prefix, the user's home)."""
    files = {}
    for entry in MANAGED:
        for path in expand(root + entry.path if entry.path.startswith("/") else entry.path, prefix, home):
            name = path[len(root) :] if root and path.startswith(root) else path
            if name in files or not os.path.isfile(path):
                continue
            answer = read(path, entry)
            if answer is not None:
                files[name] = {"role": entry.tag, **answer}
    return {"files": files, "slurmctld": slurm_hash_lines(files, root)}
