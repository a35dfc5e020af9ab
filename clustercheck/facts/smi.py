"""What `nvidia-smi -q` and `nvidia-smi -L` say of a node's GPUs, and their parsers (parse_nvidia_smi_q,
parse_nvidia_smi_list; pure, no I/O): each GPU's fields, the processes on it and its MIG devices. Part of the node's
facts (clustercheck/facts/model.py re-exports these records, where NodeFacts.smi holds them)."""

from __future__ import annotations

import re
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


# nvidia-smi -q, parsed (parse_nvidia_smi_q, below)
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


# Throttle reasons that say the hardware protects itself; the others (Idle, application clocks,
# power cap under load, sync boost) are normal operation.
BAD_THROTTLE = ("HW Slowdown", "HW Thermal Slowdown", "HW Power Brake Slowdown", "SW Thermal Slowdown")
GPU_HEADER = re.compile(r"^GPU [0-9A-Fa-f]+:[0-9A-Fa-f]+:[0-9A-Fa-f]+\.[0-9A-Fa-f]+$")


def parse_nvidia_smi_q(text: str) -> NvidiaSmi:
    """`nvidia-smi -q` -> driver, CUDA version and per-GPU fields (by indentation, as the tool prints them)."""
    result = NvidiaSmi()
    gpu: dict[str, str] | None = None
    gpus: list[tuple[str, dict[str, str], list[dict[str, str]]]] = []
    stack: list[tuple[int, str]] = []
    for raw in text.splitlines():
        if not raw.strip() or raw.startswith("="):
            continue
        indent = len(raw) - len(raw.lstrip())
        line = raw.strip()
        key, sep, value = (part.strip() for part in line.partition(":"))
        if indent == 0 and GPU_HEADER.match(line):
            gpu = {}
            gpus.append((line[4:].strip(), gpu, []))
            stack = []
            continue
        if indent == 0 and sep:
            if key == "Driver Version":
                result.driver = value or None
            elif key == "CUDA Version":
                result.cuda = value if value and value != "Not Found" else None
            continue
        if gpu is None:
            continue
        while stack and stack[-1][0] >= indent:
            stack.pop()
        if not sep:
            stack.append((indent, line))
            continue
        if [name for _, name in stack] == ["Processes"] and key in PROCESS_FIELDS:
            processes = gpus[-1][2]
            if key == "Process ID":
                processes.append({})
            if processes:
                processes[-1][key] = value  # one process's lines follow its Process ID (Name may be empty)
            continue
        if not value:  # "Key :" then a section
            stack.append((indent, key))
            continue
        path = "/".join([name for _, name in stack] + [key])
        gpu.setdefault(path, value)
    for bus_id, fields, processes in gpus:
        result.gpus.append(_gpu_from_fields(bus_id, fields, [_process(p) for p in processes if _int(p["Process ID"])]))
    return result


PROCESS_FIELDS = ("Process ID", "Type", "Name", "Used GPU Memory")


SMI_LIST_GPU = re.compile(r"^GPU (?P<index>\d+): (?P<name>.*?)(?: \(UUID: (?P<uuid>[^)]+)\))?$")
SMI_LIST_MIG = re.compile(r"^\s+MIG (?P<profile>\S+)\s+Device\s+(?P<index>\d+):(?: \(UUID: (?P<uuid>[^)]+)\))?")


def parse_nvidia_smi_list(text: str) -> dict[int, tuple[str | None, list[MigDevice]]]:
    """`nvidia-smi -L` -> {GPU index: (its UUID, the MIG devices listed under it)}: where MIG is on, each GPU's
    line is followed by one line per MIG device ('  MIG 1g.10gb     Device  0: (UUID: MIG-...)')."""
    gpus: dict[int, tuple[str | None, list[MigDevice]]] = {}
    current: list[MigDevice] | None = None
    for line in text.splitlines():
        gpu = SMI_LIST_GPU.match(line)
        mig = SMI_LIST_MIG.match(line)
        if gpu:
            current = []
            gpus[int(gpu["index"])] = (gpu["uuid"], current)
        elif mig and current is not None:
            current.append(MigDevice(mig["profile"], int(mig["index"]), mig["uuid"]))
    return gpus


def add_mig_devices(smi: NvidiaSmi, listed: dict[int, tuple[str | None, list[MigDevice]]]) -> None:
    """The MIG devices `nvidia-smi -L` lists (parse_nvidia_smi_list) onto SMI's GPUs, matched by UUID."""
    by_uuid = {uuid: devices for uuid, devices in listed.values() if uuid}
    for gpu in smi.gpus:
        gpu.mig_devices = list(by_uuid.get(gpu.uuid or "", []))


def _process(fields: dict[str, str]) -> GpuProcess:
    """One process of a GPU's Processes section (its pid is a number)."""
    return GpuProcess(
        pid=int(fields["Process ID"]),
        type=fields.get("Type") or None,
        name=fields.get("Name") or None,
        used_mib=_mib(fields.get("Used GPU Memory")),
    )


def _gpu_from_fields(bus_id: str, fields: dict[str, str], processes: list[GpuProcess]) -> Gpu:
    throttle = []
    for path, value in fields.items():
        section, _, _leaf = path.partition("/")
        if section in ("Clocks Throttle Reasons", "Clocks Event Reasons") and value == "Active":
            reason = path.rsplit("/", 1)[-1]
            if reason in BAD_THROTTLE:
                throttle.append(reason)
    return Gpu(
        bus_id=bus_id,
        name=fields.get("Product Name"),
        persistence=fields.get("Persistence Mode"),
        ecc_uncorrected=_uncorrectable(fields),
        throttle_active=sorted(set(throttle)),
        fabric_state=fields.get("Fabric/State"),
        fabric_status=fields.get("Fabric/Status"),
        processes=processes,
        uuid=_known(fields.get("GPU UUID")),
        serial=_known(fields.get("Serial Number")),
        vbios=_known(fields.get("VBIOS Version")),
        pcie_gen=_int(fields.get("PCI/GPU Link Info/PCIe Generation/Current", "")),
        pcie_gen_max=_int(fields.get("PCI/GPU Link Info/PCIe Generation/Max", "")),
        pcie_width=_lanes(fields.get("PCI/GPU Link Info/Link Width/Current")),
        pcie_width_max=_lanes(fields.get("PCI/GPU Link Info/Link Width/Max")),
        remap_pending=_yes(fields.get("Remapped Rows/Pending")),
        remap_failure=_yes(fields.get("Remapped Rows/Remapping Failure Occurred")),
        remapped_uncorrectable=_int(fields.get("Remapped Rows/Uncorrectable Error", "")),
        power_limit_w=_watts(_first(fields, POWER_SECTIONS, ("Enforced Power Limit", "Current Power Limit"))),
        power_default_w=_watts(_first(fields, POWER_SECTIONS, ("Default Power Limit",))),
        app_clocks_mhz=_clocks(fields, "Applications Clocks"),
        app_clocks_default_mhz=_clocks(fields, "Default Applications Clocks"),
        memory_total_mib=_mib(fields.get("FB Memory Usage/Total")),
        memory_used_mib=_mib(fields.get("FB Memory Usage/Used")),
        mig_mode=_known(fields.get("MIG Mode/Current")),
        mig_pending=_known(fields.get("MIG Mode/Pending")),
    )


VOLATILE = "ECC Errors/Volatile/"


def _uncorrectable(fields: dict[str, str]) -> int | None:
    """The volatile uncorrectable ECC errors (since the driver loaded) of every memory nvidia-smi -q counts: DRAM
    and SRAM on Ampere and later, where SRAM's are split into parity and SEC-DED errors, both uncorrectable (NVML's
    nvmlEccSramErrorStatus_v1_t: volatileUncParity, volatileUncSecDed, "volatile uncorrectable parity/SEC-DED error
    count", https://docs.nvidia.com/deploy/nvml-api/structnvmlEccSramErrorStatus__v1__t.html); older drivers print
    one SRAM Uncorrectable count, and older GPUs a Double Bit section whose Total sums its memories. None when
    nothing is reported (ECC off or not supported)."""
    volatile = {p[len(VOLATILE) :]: _int(v) for p, v in fields.items() if p.startswith(VOLATILE)}
    if "Double Bit/Total" in volatile:
        counted = ["Double Bit/Total"]
    else:
        counted = [k for k in volatile if "Uncorrectable" in k or k.startswith("Double Bit/")]
        if any(k.startswith("SRAM Uncorrectable ") for k in counted):  # the split counts, not a total beside them
            counted = [k for k in counted if k != "SRAM Uncorrectable"]
    known = [volatile[k] for k in counted if volatile[k] is not None]
    return sum(known) if known else None  # type: ignore[arg-type]


POWER_SECTIONS = ("Power Readings", "GPU Power Readings")  # the latter from driver 530 on


def _first(fields: dict[str, str], sections: tuple[str, ...], keys: tuple[str, ...]) -> str | None:
    for section in sections:
        for key in keys:
            if f"{section}/{key}" in fields:
                return fields[f"{section}/{key}"]
    return None


def _known(text: str | None) -> str | None:
    return None if text in (None, "", "N/A", "[N/A]", "Not Available") else text


def _yes(text: str | None) -> bool | None:
    return {"Yes": True, "No": False}.get(text or "")


def _lanes(text: str | None) -> int | None:
    return _int((text or "").rstrip("x"))


def _mib(text: str | None) -> int | None:
    match = re.match(r"(\d+) MiB$", text or "")
    return int(match[1]) if match else None


def _watts(text: str | None) -> float | None:
    match = re.match(r"([\d.]+) W$", text or "")
    return float(match[1]) if match else None


def _clocks(fields: dict[str, str], section: str) -> dict[str, int]:
    out = {}
    for path, value in fields.items():
        head, _, leaf = path.rpartition("/")
        match = re.match(r"(\d+) MHz$", value)
        if head == section and match:
            out[leaf] = int(match[1])
    return out


def _int(text: str) -> int | None:
    try:
        return int(text)
    except (TypeError, ValueError):
        return None
