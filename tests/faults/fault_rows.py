"""The fault table: one row per fault the suite puts on the 3-node test cluster, with what `clustercheck run` must
answer. Pure data (no Docker, no SSH): test_faults.py injects and asserts each row, scripts/faults_docs.py renders
docs/faults.md from these rows and the suite's recorded results, and test_faults_doc.py keeps the two equal.

`check` is the check that must FAIL (or ERROR; `statuses` for a fault clustercheck works around: the PASS or WARN
that says so; "" when no report is written: the run interrupted, or stopped before any node was contacted) and
`where` the node (or "A -> B" pair, or "cluster") it names,
`node` the node the fault is on when `where` is not that node: every other node's results must pass;
`cause` is a regular expression the first line of its message must match; `deadline` the seconds within which the
verdict must come: from the start of the run for a fault put on before it, from the moment of the fault for one
made mid-run (a killed rank, a frozen node, Ctrl-C). `args` are the run's options beside --hosts: the stages and
timeouts that make each row quick. `site` says the row needs what site.yml sets up (its firewall, chrony, Slurm,
the cluster's names in /etc/hosts, the rails): those rows run on the converged cluster, the others on the torch
cluster (torch in the recorded environment, nothing of site.yml), as users check clusters set up either way.
"""

from __future__ import annotations

from dataclasses import dataclass

from clustercheck.exitcodes import ExitCode

CORE = ("--only", "core", "--skip", "local.*")
DDP = ("--only", "ddp", "--skip", "local.*", "--nproc-per-node", "1")


@dataclass(frozen=True)
class Fault:
    id: str
    fault: str  # what is wrong, as an operator would say it
    injection: str  # how the suite makes it happen, for real, on the node
    exit_code: int
    check: str  # the check that says so ("" when the run is interrupted and no report is written)
    where: str  # the node, the pair ("A -> B"), or "cluster"
    cause: str  # regular expression for the first line of what clustercheck said
    deadline: float  # seconds to the verdict
    args: tuple[str, ...] = ()
    mid_run: bool = False  # timed from the fault, not from the start of the run
    node: str = ""  # the node the fault is on, where `where` does not say ("all": every node)
    statuses: tuple[str, ...] = ("FAIL", "ERROR")  # what `check` must say there
    mechanism: str = ""  # the class of fault this row is one instance of (docs/faults.md lists rows by it)
    site: bool = False  # needs what site.yml sets up: runs on the converged cluster, not the torch cluster

    @property
    def faulty(self) -> str:
        return self.node or self.where


# The mechanisms several rows are instances of (docs/faults.md lists the rows by them): clustercheck finds the class,
# so an instance no row shows is named the same way.
NODE = "a node does not answer"
REFUSED = "SSH refuses the node or its key"
PORTS = "a firewall drops or rejects ports training uses"
DIFFERS = "one node's software or configuration differs from the others'"
STOPS = "a job stops making progress (a rank killed, a node frozen, Ctrl-C)"
SPACE = "a file system a job needs is full or too small"
SESSION = "the SSH session is not what a tool expects"
RAIL = "a rail, or every rail of a node, slower than the same rail elsewhere"

ROWS = [
    Fault(
        "node-down",
        "a node is down",
        "`docker kill` of node2's container (powered off); started again afterwards",
        ExitCode.CHECK_FAILED,
        "connect",
        "node2",
        r"^node2\b.*unreachable",
        45,
        ("--skip", "local.*", "--connect-timeout", "3"),
        mechanism=NODE,
    ),
    Fault(
        "sshd-hung",
        "sshd does not answer on one node",
        "node2's sshd listener stopped with SIGSTOP: TCP connects, no SSH banner comes",
        ExitCode.CHECK_FAILED,
        "connect",
        "node2",
        r"^node2\b.*sent no SSH banner",
        45,
        (*CORE, "--connect-timeout", "3"),
        mechanism=NODE,
    ),
    Fault(
        "key-refused",
        "the SSH key is refused on one node",
        "node2's /root/.ssh/authorized_keys moved away",
        ExitCode.CHECK_FAILED,
        "connect",
        "node2",
        r"^node2\b.*authentication failed",
        45,
        CORE,
        mechanism=REFUSED,
    ),
    Fault(
        "host-key-changed",
        "a node's host key changed",
        "node2's SSH host keys regenerated (ssh-keygen -A, sshd restarted), as on a reinstalled node",
        ExitCode.USAGE_ERROR,
        "connect",
        "node2",
        r"^node2: HOST KEY CHANGED",
        45,
        (*CORE, "--accept-new-host-keys"),
        mechanism=REFUSED,
    ),
    Fault(
        "firewall",
        "one node's firewall drops all cluster traffic",
        "iptables on node3: every packet from the other nodes dropped except SSH",
        ExitCode.CHECK_FAILED,
        "network.tcp",
        "node1 -> node3",
        r"^node1 -> node3\b.*firewall",
        120,
        ("--skip", "local.*", "--only", "network"),
        node="node3",
        mechanism=PORTS,
        site=True,
    ),
    Fault(
        "hostname-loopback",
        "a node's hostname maps to 127.0.1.1",
        "node2's /etc/hosts line for node2 rewritten to 127.0.1.1 (in place)",
        ExitCode.CHECK_FAILED,
        "hostname.resolve",
        "node2",
        r"^node2: hostname node2 resolves only to loopback \(127\.0\.1\.1\)",
        45,
        CORE,
        mechanism="a name resolves to an address the other nodes cannot use",
    ),
    Fault(
        "torch-version",
        "torch at another version on one node",
        "node3's torch/version.py relabelled 2.12.0+cpu",
        ExitCode.CHECK_FAILED,
        "consistency.torch",
        "cluster",
        r"^torch version differs: node3 has 2\.12\.0\+cpu",
        45,
        CORE,
        node="node3",
        mechanism=DIFFERS,
    ),
    Fault(
        "rank-killed",
        "a rank is killed mid-DDP",
        "`kill -9` of node2's DDP rank while the DDP job runs",
        ExitCode.CHECK_FAILED,
        "ddp_equivalence",
        "cluster",
        r"torchrun failed on node2 first",
        45,
        mid_run=True,
        node="node2",
        mechanism=STOPS,
    ),
    Fault(
        "ddp-divergence",
        "DDP diverges on one rank",
        "a module in node3's torch environment makes SGD's learning rate 10% larger in its ranks",
        ExitCode.CHECK_FAILED,
        "ddp_equivalence",
        "cluster",
        r"rank 2 \(node3\)",
        180,
        (*DDP, "--master-port", "29671"),
        node="node3",
        mechanism="training gives another result than one process",
    ),
    Fault(
        "chrony-stopped",
        "chrony stopped on one node",
        "`systemctl stop chrony` on node2 (the setup playbook's chrony, node1 serving the others)",
        ExitCode.CHECK_FAILED,
        "time.sync",
        "node2",
        r"^node2: the clock is not synchronized: chronyd does not answer",
        45,
        CORE,
        mechanism="a service the cluster needs is not running",
        site=True,
    ),
    Fault(
        "shm-64m",
        "/dev/shm of 64 MiB on one node",
        "node3's /dev/shm remounted with size=64m (root in the node's mount namespace)",
        ExitCode.CHECK_FAILED,
        "shm.size",
        "node3",
        r"^node3: /dev/shm is 64 MiB, less than 256 MiB",
        45,
        CORE,
        mechanism=SPACE,
    ),
    Fault(
        "tmp-small",
        "a node short of disk in its temporary directory",
        "a 32 MiB tmpfs mounted on node3's /tmp (root in the node's mount namespace)",
        ExitCode.CHECK_FAILED,
        "fs.space",
        "node3",
        r"^node3: /tmp has \d+ MiB free of 32 MiB, less than 64 MiB",
        45,
        CORE,
        mechanism=SPACE,
    ),
    Fault(
        "node-frozen",
        "a node freezes mid-run",
        "`docker pause` of node2 while the DDP job runs; unpaused after the verdict",
        ExitCode.CHECK_FAILED,
        "ddp_equivalence",
        "cluster",
        r"node node2 stopped making progress at step \d+ .*its SSH connection does not answer",
        110,
        mid_run=True,
        node="node2",
        mechanism=STOPS,
    ),
    Fault(
        "node-frozen-start",
        "a node freezes while its DDP job starts",
        "`docker pause` of node2 as soon as its torchrun runs, before its ranks beat; unpaused after the verdict",
        ExitCode.CHECK_FAILED,
        "ddp_equivalence",
        "cluster",
        r"node node2 stopped making progress before its ranks reported any step \(no answer for \d+ s\); its SSH "
        r"connection does not answer; the other nodes \(node1, node3\)",
        60,
        (*DDP, "--stall-timeout", "30", "--master-port", "29711"),
        mid_run=True,
        node="node2",
        mechanism=STOPS,
    ),
    Fault(
        "node-frozen-stage",
        "a node freezes as the collectives stage starts",
        "`docker pause` of node2 as soon as clustercheck writes the collectives job's command for node2 into the run "
        "directory; unpaused after the verdict",
        ExitCode.CHECK_FAILED,
        "allreduce",
        "cluster",
        r"\bnode2\b.*its SSH connection does not answer",
        60,
        ("--only", "collectives", "--skip", "local.*", "--stall-timeout", "30", "--master-port", "29721"),
        mid_run=True,
        node="node2",
        mechanism=STOPS,
    ),
    Fault(
        "package-version",
        "a package at another version on one node",
        "node2's mpmath relabelled 0.0.1 (its METADATA edited)",
        ExitCode.CHECK_FAILED,
        "consistency.packages",
        "cluster",
        r"^1 package\(s\) differ between nodes: mpmath: node2 has 0\.0\.1, the others ",
        45,
        CORE,
        node="node2",
        mechanism=DIFFERS,
    ),
    Fault(
        "ctrl-c",
        "Ctrl-C during the DDP stage",
        "SIGINT to clustercheck while the DDP job runs on every node",
        ExitCode.INTERRUPTED,
        "",
        "cluster",
        r"^clustercheck: interrupted",
        30,
        mid_run=True,
        mechanism=STOPS,
    ),
    Fault(
        "gpus-missing",
        "the inventory expects one GPU per node on nodes without GPUs",
        "`gpus_per_node=1` in the inventory's [all:vars]",
        ExitCode.CHECK_FAILED,
        "gpu.count",
        "node1",
        r"^node1: 1 GPU\(s\) expected, but nvidia-smi does not answer",
        45,
        CORE,
        node="all",
        mechanism="the inventory expects what the node does not have",
    ),
    Fault(
        "ssh-max-sessions",
        "sshd allows one session per connection (a hardening profile's MaxSessions 1)",
        "`MaxSessions 1` in a drop-in of node2's sshd_config (sshd restarted)",
        ExitCode.OK,
        "ssh.session",
        "node2",
        r"^node2: commands run with nothing printed before their output; sshd refused more sessions on one "
        r"connection \(MaxSessions in its sshd_config\): clustercheck used \d+ connection\(s\)",
        120,
        ("--only", "core", "--only", "network", "--only", "ddp", "--skip", "local.*", "--nproc-per-node", "1"),
        statuses=("PASS",),
        mechanism=SESSION,
    ),
    Fault(
        "login-shell-output",
        "the login shell prints a greeting before every command (root's ~/.bashrc)",
        "`echo Welcome to node2, managed by the HPC team` appended to root's ~/.bashrc on node2",
        ExitCode.OK,
        "ssh.session",
        "node2",
        r"^node2: the login shell \(/bin/bash\) prints text before every command's output \(its startup file "
        r"~/\.bashrc\): 'Welcome to node2, managed by the HPC team': sftp, scp and rsync fail on this node",
        45,
        CORE,
        statuses=("WARN",),
        mechanism=SESSION,
    ),
    Fault(
        "same-machine-twice",
        "the inventory names one machine twice (node1's line copied as node1-again)",
        "`node1-again ansible_host=<node1's address>` added below node1's line in the inventory",
        ExitCode.CHECK_FAILED,
        "nodes.distinct",
        "cluster",
        r"^node1 \(\S+\) and node1-again \(\S+\) are one machine \(machine ID \w+, boot ID [\w-]+, hostname node1\)",
        45,
        ("--only", "core", "--only", "network", "--skip", "local.*"),
        node="node1",
        mechanism="the inventory names one machine twice",
    ),
    Fault(
        "link-slowed-baseline",
        "a link slowed on one node, caught against the cluster's baseline",
        "node2's egress rate-limited to 50 Mbit/s (`tc qdisc add dev eth0 root tbf rate 50mbit burst 64kb latency "
        "50ms` on node2) after a healthy `--only network` run, whose JSON report is the run's `--baseline`",
        ExitCode.CHECK_FAILED,
        "baseline.throughput",
        "cluster",
        r"^node2 -> node[13] throughput \d+ Mbit/s, baseline [\d.]+ [MG]bit/s \(-\d+ %\)",
        60,
        ("--only", "network", "--skip", "local.*", "--master-port", "29625"),
        node="node2",
        mechanism="a figure worse than the cluster's own baseline",
        site=True,
    ),
    # Issue 50, section 3: the way the inventory reaches a node, as Ansible's OpenSSH would (ProxyCommand, ProxyJump
    # hops, ssh's flags in the inventory's ssh arguments), or a one-line refusal naming the option and the node.
    Fault(
        "bastion-proxycommand",
        "node2 and node3 reachable only through a bastion, written as Ansible's FAQ writes it (ProxyCommand)",
        "the inventory names node2 and node3 by their names alone (which only the cluster's network resolves), with "
        "`ansible_ssh_common_args='-o ProxyCommand=\"ssh -W %h:%p -q root@<node1's address>\"'` (key and "
        "known_hosts given to that ssh with -i and -o)",
        ExitCode.OK,
        "connect",
        "node2",
        r"^node2: SSH to node2 as root through ProxyCommand 'ssh -W node2:22 -q .*', host key verified",
        # every connection through the ProxyCommand starts an ssh of its own that connects to the bastion first
        90,
        CORE,
        statuses=("PASS",),
        mechanism="the way the inventory reaches a node",
        site=True,
    ),
    Fault(
        "bastion-two-hops",
        "node3 reachable only through two jump hosts (node1, then node2)",
        "node3's line in the inventory without its address, with `ansible_ssh_common_args='-F <a config naming the "
        "user, key and known_hosts> -J root@<node1's address>,node2'`",
        ExitCode.OK,
        "connect",
        "node3",
        r"^node3: SSH to node3 as root through ProxyJump root@\S+,node2, host key verified",
        45,
        CORE,
        statuses=("PASS",),
        mechanism="the way the inventory reaches a node",
        site=True,
    ),
    Fault(
        "ssh-option-unhonourable",
        "node2's ssh arguments name a PKCS#11 token for the key, which clustercheck's SSH cannot use",
        "`-I /usr/lib/x86_64-linux-gnu/opensc-pkcs11.so` added to node2's `ansible_ssh_common_args` in the inventory",
        ExitCode.USAGE_ERROR,
        "",
        "node2",
        r"^clustercheck: error: node2: SSH option PKCS11Provider /usr/lib/x86_64-linux-gnu/opensc-pkcs11\.so \(from "
        r"its ssh arguments in the inventory\) cannot be honoured: paramiko has no PKCS#11 support",
        20,
        CORE,
        mechanism="the way the inventory reaches a node",
    ),
    Fault(
        "slurm-node-drained",
        "`run --slurm` asks for every node while an administrator has one drained",
        "`scontrol update nodename=node2 state=drain reason='PSU swap, ticket 7'` on node1 (the controller), then "
        "`clustercheck run --slurm --nodes 3` run there as on a login node; node2 resumed afterwards",
        ExitCode.NO_HOSTS,
        "",
        "node2",
        r"^clustercheck: error: --slurm: Slurm can grant at most 2 of the 3 nodes asked .*: node2 is drained "
        r"\(PSU swap, ticket 7; root [\d:T-]+\); ask for --nodes 2, or resume node2 \(scontrol update nodename=node2 "
        r"state=resume\)",
        30,
        ("--slurm", "--nodes", "3", "--only", "core"),
        mechanism="Slurm cannot grant what was asked",
        site=True,
    ),
    Fault(
        "slurm-node-down",
        "`run --slurm` asks for every node while one is DOWN in Slurm",
        "`scontrol update nodename=node3 state=down reason='fan failure'` on node1 (the controller), then "
        "`clustercheck run --slurm --nodes 3` run there; node3 resumed afterwards",
        ExitCode.NO_HOSTS,
        "",
        "node3",
        r"^clustercheck: error: --slurm: Slurm can grant at most 2 of the 3 nodes asked .*: node3 is down "
        r"\(fan failure; root [\d:T-]+\); ask for --nodes 2, or resume node3",
        30,
        ("--slurm", "--nodes", "3", "--only", "core"),
        mechanism="Slurm cannot grant what was asked",
        site=True,
    ),
    # -- a managed file drifted on one node (issue 50, section 5): consistency.files compares every file the roles
    # write; neither row's file is named in the code that finds it.
    Fault(
        "slurm-conf-edited",
        "node3's slurm.conf edited by hand (one setting changed, slurmd restarted there)",
        "`ReturnToService=2` made `ReturnToService=1` (or 1 made 2) in node3's /etc/slurm/slurm.conf, then `systemctl "
        "restart slurmd` there; the file put back and slurmd restarted afterwards",
        ExitCode.CHECK_FAILED,
        "consistency.files",
        "cluster",
        r"^node3: /etc/slurm/slurm\.conf differs from the copy of node1 and node2 \(role slurm\): "
        r"-ReturnToService=\d \+ReturnToService=\d",
        45,
        CORE,
        node="node3",
        mechanism=DIFFERS,
        site=True,
    ),
    Fault(
        "chrony-conf-drifted",
        "node2's chrony.conf drifted (a setting changed by hand, not yet applied)",
        "`makestep 1 3` made `makestep 1 -1` in node2's /etc/chrony/chrony.conf; the file put back afterwards",
        ExitCode.CHECK_FAILED,
        "consistency.files",
        "cluster",
        r"^node2: /etc/chrony/chrony\.conf differs from the copy of node1 and node3 \(role base\): "
        r"-makestep 1 3 \+makestep 1 -1",
        45,
        CORE,
        node="node2",
        mechanism=DIFFERS,
        site=True,
    ),
    # Issue 50, section 1: a file system a job needs, full (the mechanism: remote/filesystems.sh read by the first
    # command, judged by facts/filesystems.py's NEEDS; a program that could not be written explained by it).
    Fault(
        "tmp-full",
        "/tmp full on one node (a 16 MiB tmpfs filled to its last block)",
        "a 16 MiB tmpfs mounted on node2's /tmp (root in the node's mount namespace) and filled by `dd` until ENOSPC",
        ExitCode.CHECK_FAILED,
        "facts",
        "node2",
        r"^node2: could not collect facts with \S+: /tmp is full \(16 MiB, 0 bytes free\): clustercheck's programs "
        r"could not be written there",
        45,
        CORE,
        statuses=("ERROR",),
        mechanism=SPACE,
    ),
    Fault(
        "shm-dead-segments",
        "/dev/shm full on one node of a crashed job's segments",
        "node3's /dev/shm remounted with size=300m and filled by a process that wrote NCCL-named segments "
        "(/dev/shm/nccl-*) until ENOSPC and exited",
        ExitCode.CHECK_FAILED,
        "fs.space",
        "node3",
        r"^node3: /dev/shm has 0 bytes free of 300 MiB, less than 256 MiB \([^)]*\); \d+ file\(s\) no live process "
        r"holds open or maps hold \d+ MiB: /dev/shm/nccl-Dead0",
        45,
        CORE,
        mechanism=SPACE,
    ),
    Fault(
        "home-full",
        "the home directory of the user clustercheck runs as full on one node",
        "a 16 MiB tmpfs mounted on node2's /root (root's SSH files and dotfiles copied in first) and filled by `dd` "
        "until ENOSPC",
        ExitCode.CHECK_FAILED,
        "fs.space",
        "node2",
        r"^node2: /root \(the home directory\) has 0 bytes free of 16 MiB, less than 64 MiB",
        45,
        CORE,
        mechanism=SPACE,
    ),
    # A firewall drops part of the ports training uses (issue 50, 2): gloo and NCCL listen on ports the kernel draws
    # from ip_local_port_range, not on the rendezvous port or the probe's own; the probe samples each node's range.
    Fault(
        "ephemeral-drop",
        "one node's firewall drops new connections to part of its ephemeral port range (where gloo and NCCL listen)",
        "iptables on node3: new TCP connections from the other nodes to ports 32768-45000 dropped (first in INPUT); "
        "the rendezvous port and the probe's own ports (49152-60999) open",
        ExitCode.CHECK_FAILED,
        "network.ports",
        "node3",
        r"^node3 drops new connections to ports 32768-45000 of its ephemeral range 32768-60999 \(sampled [\d, ]+ "
        r"timed out; [\d, ]+ connected\)",
        150,  # 124 s on the torch test cluster with both cores busy (its facts: 53 s)
        ("--skip", "local.*", "--only", "network", "--master-port", "29652"),
        mechanism=PORTS,
        site=True,
    ),
    Fault(
        "ephemeral-reject",
        "one node's firewall rejects (TCP reset) new connections to another part of its ephemeral port range",
        "iptables on node2: new TCP connections from the other nodes to ports 38000-48000 rejected with tcp-reset "
        "(first in INPUT)",
        ExitCode.CHECK_FAILED,
        "network.ports",
        "node2",
        r"^node2 rejects new connections to ports 38000-48000 of its ephemeral range 32768-60999 \(sampled [\d, ]+ "
        r"refused; [\d, ]+ connected\)",
        150,  # 124 s on the torch test cluster with both cores busy (its facts: 53 s)
        ("--skip", "local.*", "--only", "network", "--master-port", "29653"),
        mechanism=PORTS,
        site=True,
    ),
    Fault(
        "ephemeral-stall",
        "one node's firewall drops new connections to its whole ephemeral port range, and only the DDP job runs",
        "iptables on node1: new TCP connections from the other nodes to ports 32768-60999 dropped (first in INPUT; "
        "the rendezvous port below it open); the run with the network stage skipped (`--only ddp`)",
        ExitCode.CHECK_FAILED,
        "ddp_equivalence",
        "cluster",
        r"node2 and node3 wait to connect to node1:\d+ \(a port node1's rank listens on\): node1 drops or rejects it",
        150,
        (*DDP, "--master-port", "29654"),  # the default stall timeout (60 s): torch starts slowly on a loaded machine
        node="node1",
        mechanism=PORTS,
        site=True,
    ),
    # Issue 54: the fabric training uses, pair by pair (the converged cluster has two rails, eth1 and eth2, named in
    # cluster_rail_interfaces: local rank i of every node binds rail i).
    Fault(
        "rail-throttled",
        "one rail of one node is slow (a bad cable, transceiver or switch port on that NIC)",
        "node2's rail 1 (eth2) egress shaped to 100 Mbit/s (`tc qdisc add dev eth2 root tbf rate 100mbit burst 32kbit "
        "latency 400ms`)",
        ExitCode.CHECK_FAILED,
        "fabric.pairs",
        "node2",
        r"^node2 rail 1 \(local rank 1, eth2\) slow with 2 partners: sends node1 [\d.]+, node3 [\d.]+",
        120,
        ("--only", "collectives", "--skip", "local.*", "--master-port", "29656"),
        mechanism=RAIL,
        site=True,
    ),
    Fault(
        "node-rails-throttled",
        "every rail of one node is slow (the node's NICs share a bad PCIe switch, NUMA placement or firmware)",
        "node3's rails eth1 and eth2 egress shaped to 100 Mbit/s each (tc tbf as above)",
        ExitCode.CHECK_FAILED,
        "fabric.pairs",
        "node3",
        r"^every rail of node3 is slow: node3 rail 0 \(local rank 0, eth1\) slow with 2 partners",
        120,
        ("--only", "collectives", "--skip", "local.*", "--master-port", "29657"),
        mechanism=RAIL,
        site=True,
    ),
]
