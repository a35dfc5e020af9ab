"""Every check clustercheck reports, registered once (registry.py). Importing this package registers them all; the
import order below is the report order: what the core stage reports per node, the cross-node consistency checks,
then the checks each multi-node stage emits.

The areas: connection, environment (python, torch, launch environment), gpu, xid (the kernel's Xid lines), gpuperf
(each GPU measured), gpuburn (the GPUs under load, with --burn), pcie, fabric (RDMA), system (OS, memory, disk, time,
names, firewall), collectives (node-local and across nodes, bandwidth), fabric_pairs (the rails, pair by pair),
transport (what NCCL/gloo really used), consistency, drift (the files the roles write, compared across the nodes),
requests (the work an option asked for, done somewhere or said to be done nowhere), network, ports (each node's
ephemeral port range sampled), data (shared directory, data paths), ddp (with the checkpoint round trip), lightning,
and baseline (this run against an earlier report, with --baseline).
"""

# isort: off
from clustercheck.checks import connection  # noqa: F401
from clustercheck.checks import environment  # noqa: F401
from clustercheck.checks import container  # noqa: F401
from clustercheck.checks import gpu  # noqa: F401
from clustercheck.checks import gpu_mig  # noqa: F401
from clustercheck.checks import xid  # noqa: F401
from clustercheck.checks import gpuperf  # noqa: F401
from clustercheck.checks import gpuburn  # noqa: F401
from clustercheck.checks import pcie  # noqa: F401
from clustercheck.checks import fabric  # noqa: F401
from clustercheck.checks import system  # noqa: F401
from clustercheck.checks import filesystems  # noqa: F401
from clustercheck.checks import epilog  # noqa: F401
from clustercheck.checks import collectives  # noqa: F401
from clustercheck.checks import nccl_net  # noqa: F401
from clustercheck.checks import fabric_pairs  # noqa: F401
from clustercheck.checks import consistency  # noqa: F401
from clustercheck.checks import drift  # noqa: F401
from clustercheck.checks import requests  # noqa: F401
from clustercheck.checks import network  # noqa: F401
from clustercheck.checks import ports  # noqa: F401
from clustercheck.checks import data  # noqa: F401
from clustercheck.checks import ddp  # noqa: F401
from clustercheck.checks import lightning  # noqa: F401
from clustercheck.checks import baseline  # noqa: F401

# isort: on
from clustercheck.checks.registry import REGISTRY, Check, get

__all__ = ["REGISTRY", "Check", "get"]
