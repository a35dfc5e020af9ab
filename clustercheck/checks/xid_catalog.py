"""NVIDIA's Xid codes as data (xid_catalog.csv beside this module): each code's mnemonic, NVIDIA's Resolution Bucket
(Immediate Action), clustercheck's action beside it, the usual cause (the application, the driver and the GPU's
firmware, or the hardware) and, where the action is not NVIDIA's bucket word for word, why. Pure; gpu.xid
(checks/xid.py) judges the kernel's Xid lines by it, and a site overrides an action per code in its inventory
(clustercheck_xid_actions, read by inventory.py).

The sources (read 2026-11-28):

- NVIDIA, "Analyzing Xid Errors with the Xid Catalog" (Ampere and newer GPUs),
  https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html: each code's Mnemonic, Description and
  "Resolution Bucket (Immediate Action)". Every row of the CSV is NVIDIA's own copy of that table,
  NVIDIA/NVSentinel's distros/kubernetes/nvsentinel/charts/gpu-health-monitor/xiderrorsmapping.csv (commit
  e712af97f39114c3ad725bb3db42793922529667; tests/unit/data/xid/ keeps it and a test holds the CSV to it). Where
  NVSentinel says UNEXPECTED_ERR_REPORT_ISSUE, NVIDIA's page says CONTACT_SUPPORT (codes it does not expect).
- The meanings: NVIDIA's Description where clustercheck quotes it; empty where not (the mnemonic says it).
- Xid 154 ("GPU recovery action changed"): its line names the recovery, e.g. "GPU recovery action changed from 0x0
  (None) to 0x1 (GPU Reset Required)" (NVIDIA/open-gpu-kernel-modules issue 446); the number is NVML's
  nvmlDeviceGpuRecoveryAction_t (cuda.bindings.nvml.DeviceGpuRecoveryAction: 0 none, 1 GPU reset, 2 node reboot,
  3 drain P2P, 4 drain P2P and reset, 5 recover the IMEX domain, 6 bus reset, 7 system reboot).

A code the CSV does not list is judged as unknown: a WARN naming it and the catalog's address.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass, replace
from pathlib import Path

from clustercheck.inventory import XID_ACTIONS, XID_ACTIONS_VAR

CATALOG_URL = "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"
CATALOG_VERSION = "r590, NVSentinel xiderrorsmapping.csv e712af97 (read 2026-11-28)"
CATALOG_FILE = Path(__file__).with_name("xid_catalog.csv")
OVERRIDE_VAR = XID_ACTIONS_VAR  # the inventory variable: {code: action} for this site

# The causes NVIDIA names, coarsely: the application (a bug or an abort in the user's program; the GPU stays
# usable), the driver (the driver or the GPU's firmware), the hardware (the GPU, its memory or its links).
APPLICATION, DRIVER, HARDWARE = "application", "driver", "hardware"
CAUSES = (APPLICATION, DRIVER, HARDWARE)

# What to do, least to most: nothing; restart the application; update the driver and firmware; drain the node and
# reset the GPU; drain and reboot; drain and report to NVIDIA; drain and have the GPU inspected.
ACTIONS = XID_ACTIONS  # the inventory's words, since a site's clustercheck_xid_actions names them
NONE, RESTART_APP, UPDATE_SWFW, RESET_GPU, REBOOT, CONTACT_SUPPORT, DRAIN_INSPECT = ACTIONS
OUT_OF_SERVICE = (UPDATE_SWFW, RESET_GPU, REBOOT, CONTACT_SUPPORT, DRAIN_INSPECT)  # drained until done: a FAIL
ACTION_WORDS = {
    NONE: "nothing to do on the node (the GPU stays usable)",
    RESTART_APP: "restart the application, and debug it if the Xid returns (compute-sanitizer, cuda-gdb)",
    UPDATE_SWFW: "drain the node and update the NVIDIA driver and the GPU's firmware",
    RESET_GPU: "drain the node and reset the GPU once nothing runs on it (nvidia-smi -r -i <id>), or reboot",
    REBOOT: "drain the node and reboot it (a GPU reset does not bring it back)",
    CONTACT_SUPPORT: "drain the node and send NVIDIA support its nvidia-bug-report.sh (NVIDIA does not expect this "
    "code on current GPUs)",
    DRAIN_INSPECT: "drain the node and have the GPU inspected (NVIDIA's field diagnostics)",
}

# Xid 154's line: "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)".
RECOVERY_RE = re.compile(r"recovery action changed from \S+ \([^)]*\) to (?P<code>0x[0-9a-fA-F]+) \((?P<words>[^)]*)\)")
RECOVERY_ACTIONS = {  # NVML's nvmlDeviceGpuRecoveryAction_t -> clustercheck's action
    0: NONE,
    1: RESET_GPU,
    2: REBOOT,
    3: RESET_GPU,  # drain peer-to-peer traffic: the GPU is taken out as for a reset
    4: RESET_GPU,
    5: DRAIN_INSPECT,  # recover the IMEX domain: beyond one node
    6: REBOOT,  # a reset of the GPU's PCIe bus, which a reboot does
    7: REBOOT,
}


@dataclass(frozen=True)
class Xid:
    """One code of NVIDIA's catalog."""

    code: int
    mnemonic: str  # NVIDIA's Mnemonic ("" where NVIDIA gives none)
    meaning: str  # NVIDIA's Description, where clustercheck quotes it
    nvidia_action: str  # NVIDIA's Resolution Bucket (Immediate Action)
    cause: str  # APPLICATION, DRIVER or HARDWARE
    action: str  # one of ACTIONS
    note: str = ""  # why the action is not NVIDIA's bucket word for word, with its source
    site: bool = False  # the action is the site's (clustercheck_xid_actions), not the catalog's

    @property
    def takes_out(self) -> bool:
        """Whether the GPU or the node must be taken out of service (drained) until the action is done."""
        return self.action in OUT_OF_SERVICE

    @property
    def name(self) -> str:
        """What the code is, in words: NVIDIA's description, else its mnemonic."""
        return self.meaning or self.mnemonic or "no mnemonic in NVIDIA's table"


def load(path: Path = CATALOG_FILE) -> dict[int, Xid]:
    """The catalog file at PATH: {code: Xid}; ValueError naming the row whose action or cause is unknown."""
    rows = csv.DictReader(line for line in path.read_text().splitlines() if not line.startswith("#"))
    catalog = {}
    for row in rows:
        entry = Xid(
            int(row["code"]),
            row["mnemonic"].strip(),
            row["meaning"].strip(),
            row["nvidia_bucket"].strip(),
            row["cause"].strip(),
            row["action"].strip(),
            row["note"].strip(),
        )
        if entry.action not in ACTIONS or entry.cause not in CAUSES:
            raise ValueError(f"{path.name}: Xid {entry.code}: action {entry.action!r} or cause {entry.cause!r} unknown")
        catalog[entry.code] = entry
    return catalog


CATALOG: dict[int, Xid] = load()


def lookup(code: int, overrides: dict[int, str] | None = None) -> Xid | None:
    """The catalog's entry for CODE, with the site's action where OVERRIDES (the node's clustercheck_xid_actions) has
    one; None for a code neither lists."""
    entry = CATALOG.get(code)
    if overrides and code in overrides:
        entry = entry or Xid(code, "", "", "(not in the catalog)", DRIVER, NONE)
        return replace(entry, action=overrides[code], site=True)
    return entry


def recovery_action(line: str) -> tuple[str, str] | None:
    """Xid 154's LINE -> (clustercheck's action, the driver's words for the recovery); None where the line names none
    this knows."""
    match = RECOVERY_RE.search(line)
    if match is None:
        return None
    action = RECOVERY_ACTIONS.get(int(match["code"], 16))
    return (action, match["words"].strip()) if action else None


def strongest(actions: list[str]) -> str:
    """The furthest-reaching of ACTIONS (reboot over reset over restart)."""
    return max(actions, key=ACTIONS.index) if actions else NONE
