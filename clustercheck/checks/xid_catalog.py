"""NVIDIA's Xid codes as data: what each means in NVIDIA's words, whether its usual cause is the application, the
driver (and the GPU's firmware) or the hardware, and what to do. Pure; gpu.xid judges the kernel's Xid lines by it.

The source, for every row (read 2026-11-27):

- NVIDIA, "Xid Errors", Analyzing Xid Errors with the Xid Catalog,
  https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html (the catalog of Ampere and newer GPUs,
  r590, also https://docs.nvidia.com/deploy/pdf/XID_Errors.pdf): each code's Mnemonic, Description and
  "Resolution Bucket (Immediate Action)" (RESTART_APP, RESET_GPU, RESTART_BM, IGNORE, WORKFLOW_...), the
  columns of NVIDIA's own copy of the table, NVIDIA/NVSentinel's xiderrorsmapping.csv
  (https://github.com/NVIDIA/NVSentinel, distros/kubernetes/nvsentinel/charts/gpu-health-monitor/).
- The cause: NVIDIA's description of each code on the same pages (e.g. Xid 13 "logged for general user application
  faults", Xid 79 "finds that the GPU is not accessible ... often caused by hardware failures on the PCI Express
  link", Xid 119 "an error occurs in code running on the GSP core of the GPU").

A code not listed here is judged as unknown: a WARN naming it and this catalog's address.
"""

from __future__ import annotations

from dataclasses import dataclass

CATALOG_URL = "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"
CATALOG_VERSION = "r590 (read 2026-11-27)"

# The causes NVIDIA names, coarsely: the application (a bug or an abort in the user's program; the GPU stays
# usable), the driver (the driver or the GPU's firmware), the hardware (the GPU, its memory or its links).
APPLICATION, DRIVER, HARDWARE = "application", "driver", "hardware"

# What to do, least to most: nothing; restart the application; drain the node and reset the GPU; drain and reboot;
# drain and have the GPU inspected.
NONE, RESTART_APP, RESET_GPU, REBOOT, DRAIN_INSPECT = "none", "restart_app", "reset_gpu", "reboot", "drain_inspect"
ACTIONS = (NONE, RESTART_APP, RESET_GPU, REBOOT, DRAIN_INSPECT)
OUT_OF_SERVICE = (RESET_GPU, REBOOT, DRAIN_INSPECT)  # the GPU or the node must be taken out of service: a FAIL
ACTION_WORDS = {
    NONE: "nothing to do on the node (the GPU stays usable)",
    RESTART_APP: "restart the application, and debug it if the Xid returns (compute-sanitizer, cuda-gdb)",
    RESET_GPU: "drain the node and reset the GPU once nothing runs on it (nvidia-smi -r -i <id>), or reboot",
    REBOOT: "drain the node and reboot it (a GPU reset does not bring it back)",
    DRAIN_INSPECT: "drain the node and have the GPU inspected (NVIDIA's field diagnostics)",
}


@dataclass(frozen=True)
class Xid:
    """One code of NVIDIA's catalog."""

    code: int
    mnemonic: str  # NVIDIA's Mnemonic
    meaning: str  # NVIDIA's Description
    nvidia_action: str  # NVIDIA's Resolution Bucket (Immediate Action)
    cause: str  # APPLICATION, DRIVER or HARDWARE
    action: str  # one of ACTIONS

    @property
    def takes_out(self) -> bool:
        """Whether the GPU or the node must be taken out of service (drained) until the action is done."""
        return self.action in OUT_OF_SERVICE


CATALOG: dict[int, Xid] = {
    x.code: x
    for x in (
        # The application's: NVIDIA says the GPU stays healthy, or the fault is the program's.
        Xid(13, "ROBUST_CHANNEL_GR_EXCEPTION", "Graphics Engine Exception", "RESTART_APP", APPLICATION, RESTART_APP),
        Xid(
            31,
            "ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT",
            "GPU memory page fault",
            "RESTART_APP",
            APPLICATION,
            RESTART_APP,
        ),
        Xid(43, "ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR", "GPU stopped processing", "IGNORE", APPLICATION, NONE),
        Xid(
            45,
            "ROBUST_CHANNEL_PREEMPTIVE_REMOVAL",
            "Preemptive cleanup, due to previous errors",
            "WORKFLOW_XID_45",
            APPLICATION,
            NONE,
        ),
        # The driver's or the GPU firmware's.
        Xid(119, "GSP_RPC_TIMEOUT", "GSP RPC Timeout", "RESET_GPU", DRIVER, RESET_GPU),
        Xid(120, "GSP_ERROR", "GSP Error", "RESET_GPU", DRIVER, RESET_GPU),
        # The hardware's.
        Xid(48, "ROBUST_CHANNEL_GPU_ECC_DBE", "Double Bit ECC Error", "WORKFLOW_XID_48", HARDWARE, RESET_GPU),
        # 63: the row is remapped (or the page retired) at the next GPU reset: "reset gpu to activate", the driver says.
        Xid(63, "INFOROM_DRAM_RETIREMENT_EVENT", "GPU memory remapping event", "IGNORE", HARDWARE, RESET_GPU),
        Xid(64, "INFOROM_DRAM_RETIREMENT_FAILURE", "GPU memory remapping failure", "RESET_GPU", HARDWARE, RESET_GPU),
        Xid(74, "NVLINK_ERROR", "NVLINK Error", "WORKFLOW_NVLINK_ERR", HARDWARE, RESET_GPU),
        Xid(
            79,
            "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS",
            "GPU has fallen off the bus",
            "RESTART_BM",
            HARDWARE,
            REBOOT,
        ),
        # 92: the single-bit errors were corrected (NVIDIA's immediate action: IGNORE); their rate says the memory
        # degrades, which NVIDIA's field diagnostics judge.
        Xid(92, "EXCESSIVE_SBE_INTERRUPTS", "High single-bit ECC error rate", "IGNORE", HARDWARE, DRAIN_INSPECT),
        # 94: contained to one application; "It is recommended to reset the GPU when convenient" (NVIDIA).
        Xid(94, "ROBUST_CHANNEL_CONTAINED_ERROR", "Contained memory error", "RESTART_APP", HARDWARE, RESET_GPU),
        Xid(95, "ROBUST_CHANNEL_UNCONTAINED_ERROR", "Uncontained memory error", "RESET_GPU", HARDWARE, RESET_GPU),
        Xid(140, "UNRECOVERABLE_ECC_ERROR_ESCAPE", "ECC Unrecovered Error", "RESET_GPU", HARDWARE, RESET_GPU),
    )
}


def lookup(code: int) -> Xid | None:
    """The catalog's entry for CODE; None for a code it does not list."""
    return CATALOG.get(code)


def strongest(actions: list[str]) -> str:
    """The furthest-reaching of ACTIONS (reboot over reset over restart)."""
    return max(actions, key=ACTIONS.index) if actions else NONE
