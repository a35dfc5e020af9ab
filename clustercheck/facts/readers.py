"""How each fact the collector does not report under a key of its own is read from its answer: one function per
NodeFacts field, given the values under the keys its declaration names (clustercheck/facts/model.py), returning
the field's value or raising NotCollected with why. Moved from collect.build, unchanged in what they decide. Pure
logic, no I/O."""

from __future__ import annotations

from typing import Any

from clustercheck.facts import parse
from clustercheck.facts import smi as smi_parse
from clustercheck.facts.records import (
    COULD_NOT_COLLECT,
    Address,
    Firewall,
    LaunchSetting,
    Package,
    Space,
    TimeSync,
    Torch,
    XidLog,
)
from clustercheck.facts.smi import NvidiaSmi
from clustercheck.remote.probing import HUNG

NOT_COLLECTED = {"error": "not collected"}  # a command the collector's answer does not hold


class NotCollected(Exception):
    """A fact that could not be collected: the field is left at its default and `missing` says why."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


class Noted:
    """A fact read, with what could not be read of it: NOTES (field or part -> why) go into `missing`."""

    def __init__(self, value: Any, notes: dict[str, str]) -> None:
        self.value, self.notes = value, notes


def python_version(python: Any) -> str | None:
    return (python or {}).get("version")


def torch(value: Any) -> Torch:
    if not isinstance(value, dict) or "error" in value or "version" not in value:
        raise NotCollected(value.get("error", COULD_NOT_COLLECT) if isinstance(value, dict) else COULD_NOT_COLLECT)
    return Torch(
        version=str(value["version"]),
        cuda=value.get("cuda"),
        cuda_available=bool(value.get("cuda_available")),
        device_count=int(value.get("device_count") or 0),
        nccl=value.get("nccl"),
        cudnn=value.get("cudnn"),
        nccl_backend=bool(value.get("nccl_backend")),
        gloo=bool(value.get("gloo")),
        nccl_error=value.get("nccl_error"),
        imported_at=value.get("imported_at") if isinstance(value.get("imported_at"), (int, float)) else None,
    )


def imports(value: Any) -> list[Package]:
    """The packages the torch probe imported beside torch (torchvision, python_env_packages)."""
    probed = value.get("packages") if isinstance(value, dict) else None
    return [
        Package(name, info.get("version"), info.get("error"), tuple(info.get("requires_torch") or ()))
        for name, info in (probed or {}).items()
    ]


def smi_error(smi: Any) -> str | None:
    """Why nvidia-smi gave nothing (not found, or its last line); None when it answered."""
    smi = smi or NOT_COLLECTED
    if smi.get("rc") != 0 or not smi.get("out"):
        return smi.get("error") or _last_line(smi) or COULD_NOT_COLLECT
    return None


def smi(smi: Any, owners: Any) -> NvidiaSmi | Noted:
    """nvidia-smi -q as the collector read it GPU by GPU (nvidia_smi_q on the node), with who runs each process and
    the MIG devices nvidia-smi -L listed; a GPU whose own call failed is named in `missing`."""
    error = smi_error(smi)
    if error is not None:
        raise NotCollected(error)
    parsed = smi_parse.parse_nvidia_smi_q(smi["out"])
    _owners(parsed, owners)
    listed = smi.get("list") if isinstance(smi.get("list"), dict) else {}
    smi_parse.add_mig_devices(parsed, smi_parse.parse_nvidia_smi_list(listed.get("out") or ""))
    if isinstance(smi.get("gpu_errors"), dict) and smi["gpu_errors"]:
        return Noted(parsed, {"smi_gpus": "; ".join(f"GPU {i}: {why}" for i, why in smi["gpu_errors"].items())})
    return parsed


def _owners(smi: NvidiaSmi, owners: Any) -> None:
    """Who runs each GPU process, from the collector's reading of /proc/PID/status (gpu_process_owners)."""
    for gpu in smi.gpus:
        for process in gpu.processes:
            owner = owners.get(str(process.pid)) if isinstance(owners, dict) and "error" not in owners else None
            if not isinstance(owner, dict):
                process.unseen = _why(owners) if isinstance(owners, dict) and "error" in owners else COULD_NOT_COLLECT
            elif "error" in owner:
                process.unseen = str(owner["error"])
            else:
                process.user = str(owner.get("user") or owner.get("uid"))
                process.name = process.name or owner.get("name") or None
                process.command = owner.get("command") or None
                run = owner.get("clustercheck_run")
                process.clustercheck_run = run if isinstance(run, dict) else None


def kernel_log(journal: Any, dmesg: Any) -> str:
    """The last 24 hours of the kernel log (journalctl -k), else dmesg."""
    log = journal or NOT_COLLECTED
    if log.get("rc") != 0 or not log.get("out"):
        log = dmesg or NOT_COLLECTED
    if log.get("rc") == 0:
        return log.get("out", "")
    raise NotCollected(log.get("error") or _last_line(log) or COULD_NOT_COLLECT)


def neighbour_overflows(journal: Any, dmesg: Any) -> list[str]:
    """The kernel log's "neighbor table overflow" lines (that log: kernel_log's), all neighbour.table reads of it:
    kept as a fact of their own, the lines outlive the whole log, which the run drops once the node's own checks
    and evidence are done (stages/core.settled)."""
    return parse.neighbour_overflows(kernel_log(journal, dmesg))


def xids(answer: Any) -> XidLog:
    """The collector's Xid lines since boot (xid_lines on the node)."""
    answer = answer or NOT_COLLECTED
    if isinstance(answer.get("lines"), list) and answer.get("source"):
        return XidLog(str(answer["source"]), [str(line) for line in answer["lines"]], int(answer.get("read") or 0))
    raise NotCollected(str(answer.get("error") or COULD_NOT_COLLECT))


def fabricmanager(answer: Any) -> str | None:
    return (answer or NOT_COLLECTED).get("out", "").strip() or None


def time(timedatectl: Any, chronyc: Any) -> TimeSync:
    """Whether the clock is synchronized, by timedatectl and chronyc. A chronyc that hung (the collector gave it up)
    where timedatectl does not say the clock is synchronized is a fact that hung: time.sync FAILs with it, as every
    check whose fact hung does (checks/registry.py)."""
    timedatectl, chronyc = timedatectl or NOT_COLLECTED, chronyc or NOT_COLLECTED
    synced = None
    shown: dict[str, str] = {}
    chrony = None
    if timedatectl.get("rc") == 0:
        shown = parse.parse_timedatectl(timedatectl.get("out", ""))
        synced = shown.get("NTPSynchronized") == "yes"
    chrony_error = None
    if chronyc.get("rc") == 0:
        chrony = parse.parse_chronyc_tracking(chronyc.get("out", ""))
        synced = synced or chrony.get("leap_status") == "Normal"
    elif str(chronyc.get("error", "")).startswith(HUNG):  # chronyc itself never came back
        if not synced:
            raise NotCollected(chronyc["error"])
        chrony_error = chronyc["error"]
    elif chronyc.get("rc") is not None:  # installed, but the daemon did not answer ("506 Cannot talk to daemon")
        said = (chronyc.get("err") or "").strip() or (chronyc.get("out") or "").strip()
        chrony_error = said.splitlines()[-1] if said else f"chronyc exited {chronyc['rc']}"
        synced = bool(synced)
    return TimeSync(synced, shown, chrony, chrony_error)


def firewall(ufw: Any, nft: Any, iptables: Any) -> Firewall:
    state = parse.firewall_state(ufw or NOT_COLLECTED, nft or NOT_COLLECTED, iptables or NOT_COLLECTED)
    return Firewall(**state)


def addresses(answer: Any) -> list[Address]:
    addr = answer or NOT_COLLECTED
    if addr.get("rc") == 0:
        return [Address(e["iface"], e["address"]) for e in parse.parse_ip_addr(addr.get("out", ""))]
    raise NotCollected(addr.get("error") or _last_line(addr) or COULD_NOT_COLLECT)


def default_route(answer: Any) -> str | None:
    """`ip route get` output."""
    route = answer or NOT_COLLECTED
    return route.get("out", "") if route.get("rc") == 0 else None


def disks(root: Any) -> list[Space]:
    """The root file system's space (the temporary directory and the other paths a job writes: the first command's
    file system reading, facts/filesystems.py)."""
    if not (isinstance(root, dict) and "free_bytes" in root):
        raise NotCollected(COULD_NOT_COLLECT)
    return [Space(root["path"], root["free_bytes"], root["total_bytes"])]


def launch_env(files: Any) -> list[LaunchSetting] | Noted:
    """The NCCL_* and GLOO_* settings of the node's environment files; a file that could not be read is named."""
    if not isinstance(files, dict) or "error" in files:
        raise NotCollected(_why(files))
    settings = []
    unreadable = []
    for path, text in files.items():
        if isinstance(text, str):
            settings += [LaunchSetting(path, line, n, v) for n, v, line in parse.parse_env_settings(text)]
        else:
            unreadable.append(path)
    if unreadable:
        return Noted(settings, {"launch_env": f"could not read {', '.join(unreadable)}"})
    return settings


def nvlink(answer: Any) -> dict[str, dict[str, Any]]:
    """nvidia-smi nvlink -s, parsed."""
    return _command(answer, parse.parse_nvlink_status)


def nvlink_errors(answer: Any) -> dict[str, dict[str, Any]]:
    """nvidia-smi nvlink -e, parsed."""
    return _command(answer, parse.parse_nvlink_errors)


def _command(answer: Any, parser) -> Any:
    answer = answer or {}
    if answer.get("rc") == 0:
        return parser(answer.get("out", ""))
    raise NotCollected(answer.get("error") or _last_line(answer) or COULD_NOT_COLLECT)


def gpu_bridges(bridges: Any) -> dict[str, list[str]]:
    if isinstance(bridges, dict) and isinstance(bridges.get("gpus"), dict):
        return {str(k): [str(b) for b in v] for k, v in bridges["gpus"].items()}
    raise NotCollected(_why(bridges))


def gpu_iommu(bridges: Any) -> dict[str, str]:
    if isinstance(bridges, dict) and isinstance(bridges.get("gpus"), dict):
        return {str(k): str(v) for k, v in (bridges.get("iommu") or {}).items()}
    return {}  # gpu_bridges says why


def acs(bridges: Any) -> dict[str, Any]:
    if not (isinstance(bridges, dict) and isinstance(bridges.get("gpus"), dict)):
        return {}  # gpu_bridges says why
    found: dict[str, Any] = {}
    for bdf, out in (bridges.get("lspci") or {}).items():
        if isinstance(out, dict) and out.get("rc") == 0:
            found[bdf] = parse.parse_acs_control(out.get("out", ""))
        else:
            found[bdf] = "lspci: " + (
                (out.get("error") or _last_line(out) or COULD_NOT_COLLECT) if isinstance(out, dict) else "?"
            )
    return found


def virt(answer: Any) -> str | None:
    """systemd-detect-virt --vm."""
    return ((answer or {}).get("out") or "").strip() or None


def _why(value: Any) -> str:
    """Why a probe's value is missing: its recorded error, else "could not collect"."""
    return str(value.get("error") or COULD_NOT_COLLECT) if isinstance(value, dict) else COULD_NOT_COLLECT


def _last_line(out: dict[str, Any]) -> str | None:
    lines = (out.get("err") or out.get("out") or "").strip().splitlines()
    return lines[-1] if lines else None


def cluster_interface(facts: Any) -> tuple[str | None, str]:
    """The interface nodes talk to each other on, and how it was found: the inventory's cluster_interface, the
    address inside cluster_cidr, the address Ansible uses, or the default route."""
    entries = [{"iface": a.iface, "address": a.address} for a in facts.addresses or []]
    node = facts.node
    return parse.pick_interface(
        entries, facts.default_route or "", node.cluster_interface, node.cluster_cidr, node.address
    )
