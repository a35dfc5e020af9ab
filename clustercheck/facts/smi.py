"""What `nvidia-smi -q` and `nvidia-smi -L` say of a node's GPUs, parsed (clustercheck/facts/parse.py): each GPU's
fields, the processes on it and its MIG devices. Part of the node's facts (clustercheck/facts/model.py re-exports
these records, where NodeFacts.smi holds them)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class GpuProcess:
    """A process on a GPU: what nvidia-smi -q's Processes section says of it, and who runs it (the collector reads
    /proc/PID/status on the node; None when it could not, with why in `unseen`)."""

    pid: int
    type: str | None = None  # C (compute), G (graphics), C+G
    name: str | None = None  # nvidia-smi's, else /proc/PID/status's Name
    used_mib: int | None = None  # "Used GPU Memory"
    user: str | None = None
    command: str | None = None
    unseen: str | None = None  # why the owner is not known
    clustercheck_run: dict | None = None  # a rank of a clustercheck run: its markers (remote/probing.run_of)

    @property
    def described(self) -> str:
        """'pid 917 python (user alice)', as the checks name a process."""
        who = f"user {self.user}" if self.user else f"user unknown: {self.unseen or 'not read'}"
        return f"pid {self.pid} {self.name or '(no name)'} ({who})"


# nvidia-smi -q, parsed (parse.parse_nvidia_smi_q)
@dataclass
class Gpu:
    bus_id: str
    name: str | None = None
    persistence: str | None = None  # "Enabled" / "Disabled"
    ecc_uncorrected: int | None = None  # volatile uncorrectable errors since the driver loaded
    throttle_active: list[str] = field(default_factory=list)  # hardware-protection reasons only
    fabric_state: str | None = None  # "Completed" on a healthy NVSwitch board
    fabric_status: str | None = None
    processes: list[GpuProcess] = field(default_factory=list)
    uuid: str | None = None
    serial: str | None = None
    vbios: str | None = None
    pcie_gen: int | None = None  # current PCIe link generation (GPUs lower it at idle to save power)
    pcie_gen_max: int | None = None  # what GPU and host both support ("Max", or "Host Max"/"Device Max")
    pcie_width: int | None = None  # current link width (lanes)
    pcie_width_max: int | None = None
    remap_pending: bool | None = None  # "Remapped Rows/Pending": a GPU reset applies the remap
    remap_failure: bool | None = None  # "Remapping Failure Occurred": the GPU ran out of spare rows
    remapped_uncorrectable: int | None = None
    power_limit_w: float | None = None  # the enforced power cap
    power_default_w: float | None = None  # the board's default power limit
    app_clocks_mhz: dict[str, int] = field(default_factory=dict)  # Applications Clocks (Graphics, Memory)
    app_clocks_default_mhz: dict[str, int] = field(default_factory=dict)
    memory_total_mib: int | None = None  # "FB Memory Usage/Total"
    memory_used_mib: int | None = None  # "FB Memory Usage/Used" (newer drivers print what they reserve apart)
    mig_mode: str | None = None  # "MIG Mode/Current": Enabled, Disabled, N/A (a GPU without MIG)
    mig_pending: str | None = None  # "MIG Mode/Pending": the mode a GPU reset will apply
    mig_devices: list[MigDevice] = field(default_factory=list)  # nvidia-smi -L's MIG lines under this GPU

    @property
    def mig(self) -> bool:
        return self.mig_mode == "Enabled"

    @property
    def mig_instances(self) -> str:
        """'7 MIG device(s): 7 x 1g.12gb', as nvidia-smi -L lists them under this GPU."""
        if not self.mig_devices:
            return "no MIG device listed"
        profiles = Counter(d.profile for d in self.mig_devices)
        shown = ", ".join(f"{n} x {profile}" for profile, n in sorted(profiles.items()))
        return f"{len(self.mig_devices)} MIG device(s): {shown}"

    @property
    def unaccounted_mib(self) -> int | None:
        """GPU memory in use beyond what the listed processes hold (what a process nvidia-smi cannot see holds:
        another container's, another PID namespace's); None when a process's share is not reported."""
        held = [p.used_mib for p in self.processes]
        if self.memory_used_mib is None or None in held:
            return None
        return self.memory_used_mib - sum(held)  # type: ignore[arg-type]


@dataclass(frozen=True)
class MigDevice:
    """A MIG device as `nvidia-smi -L` names it: '  MIG 1g.10gb     Device  0: (UUID: MIG-...)'."""

    profile: str  # "1g.10gb": compute slices and memory
    index: int
    uuid: str | None = None


@dataclass
class NvidiaSmi:
    driver: str | None = None
    cuda: str | None = None
    gpus: list[Gpu] = field(default_factory=list)
