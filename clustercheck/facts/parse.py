"""Parse what the facts collector (remote/facts.py) gathered on a node. Pure logic, no I/O.

Every parser takes raw text (recorded outputs in the tests) and returns plain
values; what could not be collected stays None, with the reason kept.
"""

from __future__ import annotations

import contextlib
import ipaddress
import re
import shlex
from dataclasses import dataclass
from typing import Any

from clustercheck.facts.model import Gpu, GpuProcess, MigDevice, NvidiaSmi
from clustercheck.facts.xidlog import logged_at

# Throttle reasons that say the hardware protects itself; the others (Idle, application clocks,
# power cap under load, sync boost) are normal operation.
BAD_THROTTLE = ("HW Slowdown", "HW Thermal Slowdown", "HW Power Brake Slowdown", "SW Thermal Slowdown")
GPU_HEADER = re.compile(r"^GPU [0-9A-Fa-f]+:[0-9A-Fa-f]+:[0-9A-Fa-f]+\.[0-9A-Fa-f]+$")
XID_RE = re.compile(r"NVRM: Xid \((?P<pci>[^)\n]*)\): (?P<xid>\d+)")


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


def _matching_lines(text: str, pattern: re.Pattern[str]) -> list[tuple[re.Match[str], str]]:
    """Each line of TEXT that PATTERN matches (within the line), with its first match: one search through the whole
    text rather than one per line, since a kernel log holds thousands of lines and a few of them matter."""
    found: list[tuple[re.Match[str], str]] = []
    end = -1
    for match in pattern.finditer(text):
        if match.start() < end:
            continue  # a second match on a line already taken
        start = text.rfind("\n", 0, match.start()) + 1
        end = text.find("\n", match.end())
        end = len(text) if end < 0 else end
        found.append((match, text[start:end].strip()))
    return found


def parse_xids(kernel_log: str) -> list[dict[str, Any]]:
    """NVRM Xid lines of the kernel log -> [{pci, xid, line, at (where in the log), time (as the log wrote it)}]."""
    return [
        {"pci": match["pci"], "xid": int(match["xid"]), "line": line, "at": match.start(), "time": logged_at(line)}
        for match, line in _matching_lines(kernel_log, XID_RE)
    ]


# The kernel's message when its neighbour table is full: "neighbour: arp_cache: neighbor table overflow!" (5.x and
# later; ndisc_cache for IPv6), "Neighbour table overflow." (2.x).
# Without its first letter (n or N) and without IGNORECASE: a pattern that starts with a literal is searched for ten
# times faster through a 130 kB log, once per node.
NEIGH_OVERFLOW_RE = re.compile(r"eighbou?r table overflow")


def neighbour_overflows(kernel_log: str) -> list[str]:
    """The kernel log's "neighbor table overflow" lines."""
    return [line for _, line in _matching_lines(kernel_log, NEIGH_OVERFLOW_RE)]


def parse_timedatectl(text: str) -> dict[str, str]:
    """`timedatectl show -p ...` -> {NTPSynchronized: yes, NTP: yes, ...}."""
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def parse_chronyc_tracking(text: str) -> dict[str, Any]:
    """`chronyc -n tracking` -> leap status and the system clock's offset from NTP time, in seconds."""
    info: dict[str, Any] = {}
    for line in text.splitlines():
        key, _, value = (p.strip() for p in line.partition(":"))
        if key == "Leap status":
            info["leap_status"] = value
        elif key == "System time":
            match = re.match(r"([\d.]+) seconds (fast|slow)", value)
            if match:
                offset = float(match[1])
                info["offset_s"] = offset if match[2] == "fast" else -offset
        elif key == "Reference ID":
            info["reference"] = value
    return info


def parse_ip_addr(text: str) -> list[dict[str, Any]]:
    """`ip -o addr show` -> [{iface, address (an ip_interface)}]."""
    entries = []
    for line in text.splitlines():
        words = line.split()
        if len(words) >= 4 and words[2] in ("inet", "inet6"):
            try:
                entries.append({"iface": words[1].split("@")[0], "address": ipaddress.ip_interface(words[3])})
            except ValueError:
                continue
    return entries


def pick_interface(
    addresses: list[dict[str, Any]],
    route_text: str,
    named: str | None,
    cidr: str | None,
    address: str | None,
) -> tuple[str | None, str]:
    """The interface nodes talk to each other on, and how it was found."""
    if named:
        return named, "cluster_interface"
    if cidr:
        try:
            network = ipaddress.ip_network(cidr, strict=False)
        except ValueError:
            network = None
        for entry in addresses:
            if network is not None and entry["address"].ip in network:
                return entry["iface"], f"address in cluster_cidr {cidr}"
    if address:
        for entry in addresses:
            if str(entry["address"].ip) == address:
                return entry["iface"], f"holds {address}"
    match = re.search(r"\bdev (\S+)", route_text)
    if match:
        return match[1], "default route"
    return None, "not found"


def firewall_state(ufw: dict[str, Any], nft: dict[str, Any], iptables: dict[str, Any]) -> dict[str, Any]:
    """Whether incoming traffic is filtered, and by what, from `ufw status`, `nft list ruleset` and `iptables -S`
    (each may be missing): read in facts/firewall.py, which walks the input hook's rules."""
    from clustercheck.facts import firewall

    return firewall.firewall_state(ufw, nft, iptables)


ENV_LINE = re.compile(r"^\s*(?:export\s+)?(?P<name>[A-Za-z_][A-Za-z0-9_]*)=(?P<value>.*?)\s*$")
LAUNCH_PREFIXES = ("NCCL_", "GLOO_")


def parse_env_settings(text: str, prefixes: tuple[str, ...] = LAUNCH_PREFIXES) -> list[tuple[str, str, int]]:
    """NAME=VALUE assignments (optionally `export`ed, as in /etc/environment, /etc/profile.d/*.sh and
    /etc/nccl.conf) whose name starts with one of PREFIXES -> [(name, value, line number)]; quotes removed."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        match = ENV_LINE.match(line.split(" #")[0] if not line.lstrip().startswith("#") else "")
        if not match or not match["name"].startswith(prefixes):
            continue
        value = match["value"].rstrip(";")
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        found.append((match["name"], value, number))
    return found


def parse_ifname_list(value: str) -> tuple[bool, bool, list[str]]:
    """NCCL_SOCKET_IFNAME's syntax: a comma-separated list of prefixes; `^` excludes them, `=` matches names
    exactly. -> (exclude, exact, names)."""
    value = value.strip()
    exclude = value.startswith("^")
    value = value.lstrip("^")
    exact = value.startswith("=")
    value = value.lstrip("=")
    return exclude, exact, [n.strip() for n in value.split(",") if n.strip()]


def iommu_mode(cmdline: str) -> str:
    """The IOMMU setting the kernel was booted with: 'passthrough' (iommu=pt or iommu.passthrough=1), 'off',
    'translated' (intel_iommu=on / amd_iommu=on without pt: DMA remapping that slows or breaks GPU peer-to-peer),
    or 'default' (nothing said: the distribution kernel's default)."""
    words = cmdline.split()
    values = {}
    for word in words:
        key, _, value = word.partition("=")
        values[key] = value
    if values.get("iommu") == "pt" or values.get("iommu.passthrough") == "1":
        return "passthrough"
    if values.get("iommu") == "off" or values.get("intel_iommu") == "off" or values.get("amd_iommu") == "off":
        return "off"
    if values.get("intel_iommu") == "on" or values.get("amd_iommu") == "on" or values.get("iommu") == "force":
        return "translated"
    return "default"


NVLINK_GPU = re.compile(r"^GPU (?P<index>\d+): (?P<name>.*?)(?: \(UUID: (?P<uuid>[^)]*)\))?\s*$")
NVLINK_LINK = re.compile(r"^\s+Link (?P<link>\d+): (?P<state>.*?)\s*$")
NVLINK_COUNTER = re.compile(r"^\s+Link (?P<link>\d+): (?P<counter>[A-Za-z][A-Za-z ]*?): (?P<value>\d+)\s*$")


def _nvlink_per_gpu(text: str, line_pattern: re.Pattern, add) -> dict[str, dict[str, Any]]:
    """An `nvidia-smi nvlink` listing -> {GPU index: {name, uuid, links}}, ADD(links, match) taking each line of
    LINE_PATTERN under a GPU; other lines (blank, an elision) are passed over."""
    gpus: dict[str, dict[str, Any]] = {}
    current: dict[str, Any] | None = None
    for line in text.splitlines():
        if match := NVLINK_GPU.match(line):
            current = {"name": match["name"], "uuid": match["uuid"], "links": {}}
            gpus[match["index"]] = current
        elif (match := line_pattern.match(line)) and current is not None:
            add(current["links"], match)
    return gpus


def parse_nvlink_status(text: str) -> dict[str, dict[str, Any]]:
    """`nvidia-smi nvlink -s` -> {GPU index: {name, uuid, links: {link: "25.781 GB/s" or None when inactive}}}."""

    def add(links: dict, match: re.Match) -> None:
        links[match["link"]] = None if "inactive" in match["state"].lower() else match["state"]

    return _nvlink_per_gpu(text, NVLINK_LINK, add)


def parse_nvlink_errors(text: str) -> dict[str, dict[str, Any]]:
    """`nvidia-smi nvlink -e` -> {GPU index: {name, uuid, links: {link: {"Replay Errors": 0, ...}}}}."""

    def add(links: dict, match: re.Match) -> None:
        links.setdefault(match["link"], {})[match["counter"]] = int(match["value"])

    return _nvlink_per_gpu(text, NVLINK_COUNTER, add)


ACS_FLAGS = ("SrcValid", "TransBlk", "ReqRedir", "CmpltRedir", "UpstreamFwd", "EgressCtrl", "DirectTrans")


def parse_acs_control(lspci_vvv: str) -> dict[str, bool] | str | None:
    """The ACSCtl line of one device's `lspci -vvv` -> {flag: on}; None when the device has no ACS capability;
    "access denied" when lspci could not read the extended capabilities (it needs root for them)."""
    for line in lspci_vvv.splitlines():
        if "ACSCtl:" in line:
            flags = {}
            for word in line.split("ACSCtl:", 1)[1].split():
                name, sign = word[:-1], word[-1:]
                if name in ACS_FLAGS and sign in "+-":
                    flags[name] = sign == "+"
            return flags
    if "<access denied>" in lspci_vvv:
        return "access denied"
    return None


DCGM_ROW = re.compile(r"^\|\s*(?P<name>[^|]*?)\s*\|\s*(?P<value>[^|]*?)\s*\|$")
DCGM_SECTION = re.compile(r"^[|+]-+\s+(?P<section>[A-Za-z][\w ]*?)\s+-+")


def parse_dcgmi_diag(text: str) -> dict[str, Any]:
    """`dcgmi diag -r N` (its table) -> {metadata: {...}, tests: [{section, test, result, info}]}; an "Info"
    or "Warning" row, and the rows that continue it, go to the test above them."""
    metadata: dict[str, str] = {}
    tests: list[dict[str, Any]] = []
    section = None
    last_key = None
    for line in text.splitlines():
        if match := DCGM_SECTION.match(line):
            section = match["section"]
            continue
        match = DCGM_ROW.match(line)
        if not match or section is None:
            continue
        name, value = match["name"], match["value"]
        if section == "Metadata":
            if name:
                metadata[name] = value
                last_key = name
            elif last_key:
                metadata[last_key] += value
            continue
        if name in ("Info", "Warning") or (not name and tests):
            if tests:
                tests[-1]["info"] = (tests[-1].get("info", "") + value) if name == "" else value
            continue
        if name:
            tests.append({"section": section, "test": name, "result": value})
    return {"metadata": metadata, "tests": tests}


@dataclass(frozen=True)
class Identity:
    """What tells one running machine from another. Each alone can be shared: systemd's machine ID by clones of an
    image that was not reset, the kernel's boot ID by containers on one kernel, the hostname by anything; all three
    together only by the same machine reached under two names."""

    machine_id: str | None  # /etc/machine-id
    boot_id: str | None  # /proc/sys/kernel/random/boot_id
    hostname: str | None  # uname -n

    @property
    def key(self) -> tuple[str, str, str] | None:
        """What two names of one machine share; None when the boot ID could not be read (nothing to compare)."""
        if not self.boot_id:
            return None
        return (self.machine_id or "", self.boot_id, self.hostname or "")


# sh -c IDENTITY_SCRIPT: the three lines parse_identity reads (an empty line where a file cannot be read).
IDENTITY_SCRIPT = (
    "echo machine_id=$(cat /etc/machine-id 2>/dev/null); "
    "echo boot_id=$(cat /proc/sys/kernel/random/boot_id 2>/dev/null); "
    "echo hostname=$(uname -n)"
)


def parse_identity(text: str) -> Identity | None:
    """IDENTITY_SCRIPT's output (or the first command's, which holds it); None when it holds none of its lines."""
    found: dict[str, str | None] = {}
    for line in text.splitlines():
        key, sep, value = line.strip().partition("=")
        if sep and key in ("machine_id", "boot_id", "hostname"):
            found[key] = value.strip() or None
    if not found:
        return None
    return Identity(found.get("machine_id"), found.get("boot_id"), found.get("hostname"))


LEFTOVERS_LINE = "--- leftovers"  # in the first command's output: the startup sweep's lines follow
FACTS_LINE = "--- facts"  # ... and the facts collector's output after this one


def first_script(recorded: str, sweep: str | None = None, then: str | None = None) -> str:
    """The first command on a node (sh -c FIRST_SCRIPT sh CANDIDATE FALLBACK SECONDS ...): the node's clock (first,
    on a line of its own, so that its arrival times it), its identity (IDENTITY_SCRIPT), the login shell and home
    directory, the python to run the node-side programs with (CANDIDATE; when empty, the first line of the file
    RECORDED, else FALLBACK) in $py and whether it starts within SECONDS in $runs (yes or no); then SWEEP's output
    (the startup sweep) after LEFTOVERS_LINE. All of it after the clock is written at once (each write is a packet
    the controller handles), and none of it reads standard input, which is THEN's: the shell that follows
    FACTS_LINE, with $py, $runs and the arguments after SECONDS. parse_first reads the output."""
    steps = [
        f'o="$({IDENTITY_SCRIPT})${{nl}}shell=$SHELL${{nl}}home=$HOME${{nl}}"',
        'py=$1; if [ -z "$py" ]; then '
        f"py=$(sed -n 's/^[[:space:]]*//; s/[[:space:]]*$//; /./{{p;q;}}' {shlex.quote(recorded)} 2>/dev/null); "
        'if [ -n "$py" ]; then o="${o}recorded=$py$nl"; else py=$2; fi; fi',
        'if timeout -k 1 "$3" "$py" -c "import sys" >/dev/null 2>&1; then runs=yes; else runs=no; fi',
        'o="${o}python=$py${nl}python_runs=$runs$nl"',
    ]
    if sweep is not None:
        steps.append(f'swept=$({sweep}); o="${{o}}{LEFTOVERS_LINE}$nl${{swept:+$swept$nl}}"')
    script = "nl='\n'; " + 'echo "clock=$(date +%s.%N)"; { ' + "; ".join(steps) + "; } </dev/null"
    if then is None:
        return script + '; printf %s "$o"'
    return script + f'; printf %s "$o{FACTS_LINE}$nl"; {then}'


@dataclass(frozen=True)
class FirstAnswer:
    """What first_script printed; None for each line it did not print."""

    clock: float | None  # the node's time, epoch seconds, when the command started
    identity: Identity | None
    shell: str | None  # the login shell ($SHELL)
    home: str | None
    recorded: str | None  # the python recorded on the node, when CANDIDATE was empty and the file named one
    python: str | None  # the python it tried
    python_runs: bool | None
    leftovers: str | None  # the startup sweep's output, None when it did not run
    then: str | None  # what followed FACTS_LINE, None when nothing did


def parse_first(text: str) -> FirstAnswer:
    """first_script's output."""
    text, has_then, then = text.partition(FACTS_LINE + "\n")
    head, swept, tail = text.partition(LEFTOVERS_LINE + "\n")
    head = head[: head.rfind("\n") + 1]  # a line cut short (the session closed under it) is not read
    found: dict[str, str] = {}
    for line in head.splitlines():
        key, eq, value = line.partition("=")
        if eq and key in ("clock", "shell", "home", "recorded", "python", "python_runs"):
            found[key] = value.strip()
    clock = None
    with contextlib.suppress(ValueError):
        clock = float(found.get("clock", ""))
    runs = found.get("python_runs")
    return FirstAnswer(
        clock=clock,
        identity=parse_identity(head),
        shell=found.get("shell") or None,
        home=found.get("home") or None,
        recorded=found.get("recorded") or None,
        python=found.get("python") or None,
        python_runs=None if runs is None else runs == "yes",
        leftovers=tail if swept else None,
        then=then if has_then else None,
    )
