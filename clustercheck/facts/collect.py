"""Turn the collector's JSON (remote/facts.py) into NodeFacts: every raw output parsed once, every "could not
collect" decided here and only here. Pure logic, no I/O."""

from __future__ import annotations

from typing import Any

from clustercheck.facts import parse
from clustercheck.facts import smi as smi_parse
from clustercheck.facts.model import (
    COULD_NOT_COLLECT,
    HUNG,
    Address,
    Firewall,
    LaunchSetting,
    NodeFacts,
    NvidiaSmi,
    Package,
    Space,
    TimeSync,
    Torch,
    XidLog,
    declared,
)
from clustercheck.inventory import Node


def build(
    node: Node,
    raw: dict[str, Any],
    *,
    python: str,
    python_source: str,
    python_missing: str | None = None,
    cluster_size: int = 1,
    clock_offset: float | None = None,
    clock_uncertainty: float | None = None,
) -> NodeFacts:
    missing: dict[str, str] = {}
    commands = raw.get("commands") if isinstance(raw.get("commands"), dict) else {}

    def command(name: str) -> dict[str, Any]:
        return commands.get(name) or {"error": "not collected"}

    facts = NodeFacts(
        node=node,
        python=python,
        python_source=python_source,
        python_missing=python_missing,
        cluster_size=cluster_size,
        clock_offset=clock_offset,
        clock_uncertainty=clock_uncertainty,
        missing=missing,
        raw=raw,
    )
    facts.python_version = (raw.get("python") or {}).get("version")
    for name, declaration in declared().items():
        value = raw.get(declaration.key, {"error": COULD_NOT_COLLECT})
        if isinstance(value, dict) and set(value) == {"error"}:  # the probe failed: what it said
            missing[name] = str(value["error"] or COULD_NOT_COLLECT)
            continue
        try:
            setattr(facts, name, declaration.parse(value))
        except (TypeError, ValueError, KeyError, AttributeError):
            missing[name] = COULD_NOT_COLLECT

    facts.torch = _torch(raw.get("torch"), missing)
    probed = (raw.get("torch") or {}).get("packages") if isinstance(raw.get("torch"), dict) else None
    for name, info in (probed or {}).items():
        facts.imports.append(
            Package(name, info.get("version"), info.get("error"), tuple(info.get("requires_torch") or ()))
        )

    _smi(facts, command("nvidia_smi_q"))

    log = command("kernel_log")
    if log.get("rc") != 0 or not log.get("out"):
        log = command("dmesg")
    if log.get("rc") == 0:
        facts.kernel_log = log.get("out", "")
    else:
        missing["kernel_log"] = log.get("error") or _last_line(log) or COULD_NOT_COLLECT

    facts.xids = _xids(command("xids"), missing)
    facts.fabricmanager = command("fabricmanager").get("out", "").strip() or None

    facts.time = _time(command("timedatectl"), command("chronyc"))
    state = parse.firewall_state(command("ufw"), command("nft"), command("iptables"))
    facts.firewall = Firewall(**state)

    addr = command("ip_addr")
    if addr.get("rc") == 0:
        facts.addresses = [Address(e["iface"], e["address"]) for e in parse.parse_ip_addr(addr.get("out", ""))]
    else:
        missing["addresses"] = addr.get("error") or _last_line(addr) or COULD_NOT_COLLECT
    route = command("ip_route")
    facts.default_route = route.get("out", "") if route.get("rc") == 0 else None
    facts.interface, facts.interface_how = cluster_interface(facts)

    disks = [raw.get("disk_root"), raw.get("disk_tmp")]
    known = [
        Space(d["path"], d["free_bytes"], d["total_bytes"]) for d in disks if isinstance(d, dict) and "free_bytes" in d
    ]
    if known:
        facts.disks = known
    else:
        missing["disks"] = COULD_NOT_COLLECT
    _hardware_and_environment(facts)
    return facts


def _hardware_and_environment(facts: NodeFacts) -> None:
    """Launch environment files, NVLink and the GPUs' PCIe bridges."""
    raw = facts.raw
    files = raw.get("launch_files")
    if isinstance(files, dict) and "error" not in files:
        settings = []
        unreadable = []
        for path, text in files.items():
            if isinstance(text, str):
                settings += [LaunchSetting(path, line, n, v) for n, v, line in parse.parse_env_settings(text)]
            else:
                unreadable.append(path)
        facts.launch_env = settings
        if unreadable:
            facts.missing["launch_env"] = f"could not read {', '.join(unreadable)}"
    else:
        facts.missing["launch_env"] = _why(files)
    for name, parser in (("nvlink", parse.parse_nvlink_status), ("nvlink_errors", parse.parse_nvlink_errors)):
        answer = (raw.get("commands") or {}).get(name) or {}
        if answer.get("rc") == 0:
            setattr(facts, name, parser(answer.get("out", "")))
        else:
            facts.missing[name] = answer.get("error") or _last_line(answer) or COULD_NOT_COLLECT
    bridges = raw.get("gpu_bridges")
    if isinstance(bridges, dict) and isinstance(bridges.get("gpus"), dict):
        facts.gpu_bridges = {str(k): [str(b) for b in v] for k, v in bridges["gpus"].items()}
        facts.gpu_iommu = {str(k): str(v) for k, v in (bridges.get("iommu") or {}).items()}
        for bdf, out in (bridges.get("lspci") or {}).items():
            if isinstance(out, dict) and out.get("rc") == 0:
                facts.acs[bdf] = parse.parse_acs_control(out.get("out", ""))
            else:
                facts.acs[bdf] = "lspci: " + (
                    (out.get("error") or _last_line(out) or COULD_NOT_COLLECT) if isinstance(out, dict) else "?"
                )
    else:
        facts.missing["gpu_bridges"] = _why(bridges)
    virt = (raw.get("commands") or {}).get("virt") or {}
    facts.virt = (virt.get("out") or "").strip() or None


def _xids(answer: dict[str, Any], missing: dict[str, str]) -> XidLog | None:
    """The collector's Xid lines since boot (xid_lines on the node)."""
    if isinstance(answer.get("lines"), list) and answer.get("source"):
        return XidLog(str(answer["source"]), [str(line) for line in answer["lines"]], int(answer.get("read") or 0))
    missing["xids"] = str(answer.get("error") or COULD_NOT_COLLECT)
    return None


def _smi(facts: NodeFacts, smi: dict[str, Any]) -> None:
    """nvidia-smi -q as the collector read it GPU by GPU (nvidia_smi_q on the node), with who runs each process and
    the MIG devices nvidia-smi -L listed; a GPU whose own call failed is named in `missing`."""
    if smi.get("rc") != 0 or not smi.get("out"):
        facts.smi_error = smi.get("error") or _last_line(smi) or COULD_NOT_COLLECT
        facts.missing["smi"] = facts.smi_error
        return
    facts.smi = smi_parse.parse_nvidia_smi_q(smi["out"])
    _owners(facts.smi, facts.raw.get("gpu_processes"))
    listed = smi.get("list") if isinstance(smi.get("list"), dict) else {}
    smi_parse.add_mig_devices(facts.smi, smi_parse.parse_nvidia_smi_list(listed.get("out") or ""))
    if isinstance(smi.get("gpu_errors"), dict) and smi["gpu_errors"]:
        facts.missing["smi_gpus"] = "; ".join(f"GPU {i}: {why}" for i, why in smi["gpu_errors"].items())


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


def _why(value: Any) -> str:
    """Why a probe's value is missing: its recorded error, else "could not collect"."""
    return str(value.get("error") or COULD_NOT_COLLECT) if isinstance(value, dict) else COULD_NOT_COLLECT


def _last_line(out: dict[str, Any]) -> str | None:
    lines = (out.get("err") or out.get("out") or "").strip().splitlines()
    return lines[-1] if lines else None


def _torch(value: Any, missing: dict[str, str]) -> Torch | None:
    if not isinstance(value, dict) or "error" in value or "version" not in value:
        missing["torch"] = value.get("error", COULD_NOT_COLLECT) if isinstance(value, dict) else COULD_NOT_COLLECT
        return None
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


def _time(timedatectl: dict[str, Any], chronyc: dict[str, Any]) -> TimeSync:
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
        chrony_error, synced = chronyc["error"], bool(synced)
    elif chronyc.get("rc") is not None:  # installed, but the daemon did not answer ("506 Cannot talk to daemon")
        said = (chronyc.get("err") or "").strip() or (chronyc.get("out") or "").strip()
        chrony_error = said.splitlines()[-1] if said else f"chronyc exited {chronyc['rc']}"
        synced = bool(synced)
    return TimeSync(synced, shown, chrony, chrony_error)


def cluster_interface(facts: NodeFacts) -> tuple[str | None, str]:
    """The interface nodes talk to each other on, and how it was found: the inventory's cluster_interface, the
    address inside cluster_cidr, the address Ansible uses, or the default route."""
    entries = [{"iface": a.iface, "address": a.address} for a in facts.addresses or []]
    node = facts.node
    return parse.pick_interface(
        entries, facts.default_route or "", node.cluster_interface, node.cluster_cidr, node.address
    )


def cluster_address(facts: NodeFacts) -> str:
    """The node's IPv4 address on the cluster interface: the inventory address when it is one of them."""
    import ipaddress

    mine = [str(a.address.ip) for a in facts.addresses or [] if a.iface == facts.interface and a.address.version == 4]
    if facts.node.address in mine:
        return facts.node.address
    if mine:
        return mine[0]
    try:
        return str(ipaddress.ip_address(facts.node.address))
    except ValueError:
        return facts.node.address
