"""The node's NVIDIA GPUs, from `nvidia-smi -q` and the kernel log (its Xid lines judged by xid_catalog.py). GPU
checks SKIP on a node without a GPU unless the inventory says GPUs are expected there (gpus_per_node)."""

from __future__ import annotations

from clustercheck import expected as expected_values
from clustercheck.checks.network import own_job
from clustercheck.checks.registry import Finding, fail, node_check, passed, skip, warn
from clustercheck.facts.model import COULD_NOT_COLLECT, Gpu, GpuProcess, NodeFacts


@node_check(
    "gpu.count",
    proves="the node has the GPUs the inventory expects (gpus_per_node), else as many as a board of its model "
    "carries (its expected values), and nvidia-smi answers",
    fix="A missing GPU has fallen off the bus or is not seated: check `nvidia-smi -L`, the kernel log "
    "(Xid 79) and reboot; otherwise set gpus_per_node in the inventory to what this node should have.",
)
def gpu_count(facts: NodeFacts) -> Finding:
    expected = facts.node.gpus_expected
    smi = facts.smi
    if smi is None:
        if not expected:
            return skip("no NVIDIA GPU on this node (none expected)", expected=expected)
        return fail(
            f"{expected} GPU(s) expected, but nvidia-smi does not answer: {facts.smi_error or COULD_NOT_COLLECT}",
            "Install the NVIDIA driver (the setup playbook's nvidia_driver role) and reboot; check `nvidia-smi`.",
            expected=expected,
            found=0,
        )
    found = len(smi.gpus)
    names = sorted({g.name or "?" for g in smi.gpus})
    unread = facts.missing.get("smi_gpus")  # nvidia-smi -q -i INDEX failed for these GPUs, the others answered
    if unread:
        return fail(
            f"{found} GPU(s) read, nvidia-smi -q failed for the others: {unread}",
            "A GPU that nvidia-smi cannot read alone is hung or has fallen off the bus: check the kernel log (Xid 79) "
            "and nvidia-smi -q -i INDEX; drain the node and reset the GPU or reboot.",
            expected=expected,
            found=found,
            unread=unread,
        )
    match = facts.expected
    model = match.model
    data = {"expected": expected, "found": found, "names": names, "model": model.name if model else None}
    if expected is not None and found != expected:
        return fail(f"{found} GPU(s) found, {expected} expected ({', '.join(names)})", **data)
    boards = model.get("gpus_per_node") if model and expected is None else None
    if boards and found not in boards:
        counts = " or ".join(map(str, boards))
        return warn(
            f"{found} GPU(s) found, where {model.name} boards carry {counts} ({match.why}); gpus_per_node in "
            "the inventory says how many this node should have",
            **data,
        )
    if expected is not None:
        how = f"{expected} expected"
    elif model:
        how = match.why
    else:
        how = match.fallback("the count is compared with the other nodes' only (consistency.gpu_count)")
    return passed(f"{found} GPU(s): {', '.join(names)} ({how})", **data)


@node_check(
    "gpu.memory",
    proves="every GPU has the memory its model's datasheet gives (nvidia-smi's FB Memory Total against the "
    "model's expected values; SKIP for a model without them)",
    fix="A GPU with less memory than its model is another variant than the inventory assumes, a vGPU, or has "
    "memory retired (gpu.remapped_rows): compare nvidia-smi -q (FB Memory Usage) with the datasheet; where MIG is "
    "on, the message names it and gpu.mig judges its instances.",
    needs_gpu=True,
)
def gpu_memory(facts: NodeFacts) -> Finding:
    assert facts.smi is not None
    match = facts.expected
    sizes = {g.bus_id: g.memory_total_mib for g in facts.smi.gpus}
    datasheet = match.model.get("memory_gb") if match.model else None
    data = {"memory_mib": sizes, "expected_gb": datasheet}
    if datasheet is None:
        return skip(match.fallback("memory not compared with a datasheet"), **data)
    least = datasheet * 1e9 * expected_values.MEMORY_SHORT
    short = {bus: mib for bus, mib in sizes.items() if mib is not None and mib * 2**20 < least}
    if short:
        detail = ", ".join(f"{bus}: {mib} MiB" for bus, mib in short.items())
        message = f"less memory than the {datasheet:g} GB of {match.model.name}: {detail} ({match.why})"
        mig = [g for g in facts.smi.gpus if g.bus_id in short and g.mig]
        if mig:  # the whole GPU's memory is what nvidia-smi -q reports; MIG is named, its instances by gpu.mig
            message += "; MIG is on for " + ", ".join(f"{g.bus_id} ({g.mig_instances})" for g in mig)
        return warn(message, **data)
    if all(mib is None for mib in sizes.values()):
        return passed(f"memory not reported by nvidia-smi ({match.why})", **data)
    shown = ", ".join(sorted({f"{mib} MiB" for mib in sizes.values() if mib is not None}))
    return passed(f"{shown} per GPU, the {datasheet:g} GB of {match.model.name} ({match.why})", **data)


@node_check(
    "gpu.driver",
    proves="the NVIDIA driver answers and reports its version",
    fix="Reinstall the driver (the setup playbook's nvidia_driver role) and reboot.",
    needs_gpu=True,
)
def gpu_driver(facts: NodeFacts) -> Finding:
    smi = facts.smi
    assert smi is not None
    if not smi.driver:
        return fail("nvidia-smi reports no driver version", "Reinstall the driver.")
    return passed(f"driver {smi.driver}, CUDA {smi.cuda}", driver=smi.driver, cuda=smi.cuda)


PERSISTENCE_URL = "https://docs.nvidia.com/deploy/driver-persistence/persistence-daemon.html"


@node_check(
    "gpu.persistence",
    proves="persistence mode is on for every GPU (nvidia-smi -q's Persistence Mode): without it the driver unloads "
    "a GPU's state whenever no client holds it, and every job, nvidia-smi call and health probe initialises the "
    "GPU again (NVIDIA's Driver Persistence guide)",
    fix="Run nvidia-persistenced with persistence mode on, at every boot, as NVIDIA recommends (Driver Persistence, "
    f"{PERSISTENCE_URL}): the setup playbook's nvidia_driver role does it (Ubuntu's packaged unit runs "
    "--no-persistence-mode, so `systemctl start nvidia-persistenced` alone leaves it off). `nvidia-smi -pm 1` (as "
    "root) is NVIDIA's legacy persistence mode: it turns it on at once, until the driver unloads or the node reboots.",
    needs_gpu=True,
)
def gpu_persistence(facts: NodeFacts) -> Finding:
    assert facts.smi is not None
    off = [g.bus_id for g in facts.smi.gpus if g.persistence != "Enabled"]
    if off:
        return warn(
            f"persistence mode is off on {len(off)} of {len(facts.smi.gpus)} GPU(s) ({', '.join(off)}): every "
            "nvidia-smi call and job start initialises them again",
            off=off,
        )
    return passed(f"persistence mode on for every GPU ({len(facts.smi.gpus)})")


@node_check(
    "gpu.ecc",
    proves="no GPU has uncorrectable ECC errors since the driver loaded (nvidia-smi -q's volatile counts: DRAM, and "
    "SRAM parity and SEC-DED errors, both uncorrectable by NVML's definition)",
    fix="Drain the node, reset the GPU (nvidia-smi -r) or reboot; replace the GPU if the errors return.",
    needs_gpu=True,
)
def gpu_ecc(facts: NodeFacts) -> Finding:
    assert facts.smi is not None
    counts = {g.bus_id: g.ecc_uncorrected for g in facts.smi.gpus}
    bad = {bus: n for bus, n in counts.items() if n}
    if bad:
        return fail(
            "uncorrectable ECC errors: " + ", ".join(f"{bus}: {n}" for bus, n in bad.items()),
            uncorrected=counts,
        )
    if all(n is None for n in counts.values()):
        return passed("ECC not reported (off or not supported)", uncorrected=counts)
    return passed("no uncorrectable ECC errors", uncorrected=counts)


@node_check(
    "gpu.throttle",
    proves="no GPU is slowed by thermal or power-brake protection",
    fix="Check cooling and power delivery (nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER).",
    needs_gpu=True,
)
def gpu_throttle(facts: NodeFacts) -> Finding:
    assert facts.smi is not None
    throttled = {g.bus_id: g.throttle_active for g in facts.smi.gpus if g.throttle_active}
    if throttled:
        detail = "; ".join(f"{bus}: {', '.join(r)}" for bus, r in throttled.items())
        return warn(f"clocks throttled by hardware protection ({detail})", throttled=throttled)
    return passed("no thermal or power-brake throttling")


@node_check(
    "gpu.fabricmanager",
    proves="on NVSwitch boards, nvidia-fabricmanager runs and every GPU's fabric is trained",
    fix="Install nvidia-fabricmanager matching the driver version exactly and systemctl enable --now it.",
)
def gpu_fabricmanager(facts: NodeFacts) -> Finding:
    switches = facts.nvswitches
    if not switches:
        return skip("no NVSwitch on this node")
    service = facts.fabricmanager or COULD_NOT_COLLECT
    states = {g.bus_id: (g.fabric_state, g.fabric_status) for g in (facts.smi.gpus if facts.smi else [])}
    bad = {bus: s for bus, s in states.items() if s[0] not in (None, "Completed") or s[1] not in (None, "Success")}
    if service != "active" or bad:
        cause = f"nvidia-fabricmanager is {service}" if service != "active" else "fabric not trained"
        return fail(
            f"{switches} NVSwitch(es), {cause}" + (f" ({len(bad)} GPU(s) not Completed/Success)" if bad else ""),
            service=service,
            fabric=states,
        )
    return passed(f"{switches} NVSwitch(es), fabric manager active")


# GPU memory in use beyond what the listed processes hold that is judged as held by a process nvidia-smi cannot see.
# A GPU nothing runs on reports little or none: 0 MiB used on an H200 (driver 580) and an H800 (driver 525), whose
# drivers print what they reserve apart (616 and 516 MiB, "Reserved"); the A10G's one process holds all but 6 of the
# MiB in use (tests/unit/data/README.md, "GPU state"). What an idle GPU shows may differ with the driver and the
# MIG setup, so the margin is wide: a job holds gigabytes (the container of microsoft/pai issue 2001, 11637 MiB), and
# 1 GiB leaves every idle figure found far below it.
HIDDEN_MIB = 1024


@node_check(
    "gpu.processes",
    proves="no other process uses the GPUs (it would skew numbers or run out of memory); each one is named with its "
    "pid, name, user and the GPU memory it holds (and its share of the GPU's); memory in use beyond what the listed "
    f"processes hold (over {HIDDEN_MIB} MiB: nvidia-smi lists no process of another container or PID namespace) "
    "is named as held by one; in node-health --slurm, either on a node where no Slurm job runs is a leftover "
    "(FAIL: the node is drained), while a job runs it is the job's; a rank of another clustercheck run is named as "
    "that run (WARN: wait for it), never as a leftover",
    fix="Stop them before training or benchmarking (kill PID, as their user or root), or expect lower numbers; "
    "memory held by no listed process belongs to another container or PID namespace (the driver does not know PID "
    "namespaces): find it with nvidia-smi on the host or in a container run with --pid=host, or docker ps / "
    "crictl ps.",
    needs_gpu=True,
)
def gpu_processes(facts: NodeFacts) -> Finding:
    assert facts.smi is not None
    every = [(g, p) for g in facts.smi.gpus for p in g.processes]
    hidden = {g.bus_id: g.unaccounted_mib for g in facts.smi.gpus if (g.unaccounted_mib or 0) > HIDDEN_MIB}
    if not every and not hidden:
        return passed("no process on the GPUs, and no memory in use beyond a few MiB")
    data = {"processes": [_process_data(g, p) for g, p in every], "hidden_mib": hidden, "slurm_job": facts.slurm_job}
    # A rank of another clustercheck run (its markers on the node) is a live job, never a stranger's leftover.
    runs = sorted({own_job(p.clustercheck_run) for _, p in every if p.clustercheck_run})
    busy = [(g, p) for g, p in every if not p.clustercheck_run]
    if runs and not busy and not hidden:
        return warn(
            f"another clustercheck run ({'; '.join(runs)}) holds the GPUs: " + "; ".join(_held(g, p) for g, p in every),
            "Wait for that run to end (clustercheck jobs lists the detached ones), or verify other nodes meanwhile: "
            "figures measured beside it are shared with its ranks.",
            **data,
        )
    named = [_held(g, p) for g, p in busy] + [
        f"another container or PID namespace holds {mib / 1024:.1f} GiB on GPU {bus} (nvidia-smi lists "
        + ("no process there" if not any(gpu.bus_id == bus for gpu, _ in busy) else "processes holding less")
        + ")"
        for bus, mib in hidden.items()
    ]
    shown = "; ".join(named)
    if facts.slurm_job:
        return passed(f"{_counted(busy, hidden)} of the Slurm job running on this node: {shown}", **data)
    if facts.slurm_job is False:
        pids = " ".join(str(p.pid) for _, p in busy)
        stop = f"Stop them (kill {pids}, as their user or root) or find whose they are" if busy else "Find whose it is"
        if hidden:
            stop += " (memory no listed process holds: nvidia-smi on the host or with --pid=host, docker ps, crictl ps)"
        return fail(
            f"leftover: no Slurm job runs on this node, yet {_counted(busy, hidden)} hold the GPUs: {shown}",
            f"{stop}; node-health --slurm drains the node with this reason and resumes it once a run finds the GPUs "
            "free.",
            **data,
        )
    return warn(f"{_counted(busy, hidden)} already use the GPUs: {shown}", **data)


def _counted(busy: list, hidden: dict) -> str:
    """'2 process(es)', 'memory of no listed process', or both."""
    parts = [f"{len(busy)} process(es)"] if busy else []
    return " and ".join(parts + (["memory of no listed process"] if hidden else []))


def _held(gpu: Gpu, process: GpuProcess) -> str:
    """'pid 917 python (user alice) holds 100.0 GiB of GPU 00000000:18:00.0 (70% of its memory)'."""
    if process.used_mib is None:
        return f"{process.described} on GPU {gpu.bus_id} (memory not reported)"
    share = f" ({process.used_mib / gpu.memory_total_mib:.0%} of its memory)" if gpu.memory_total_mib else ""
    return f"{process.described} holds {process.used_mib / 1024:.1f} GiB of GPU {gpu.bus_id}{share}"


def _process_data(gpu: Gpu, process: GpuProcess) -> dict:
    total = gpu.memory_total_mib
    return {
        "gpu": gpu.bus_id,
        "pid": process.pid,
        "name": process.name,
        "user": process.user,
        "type": process.type,
        "used_mib": process.used_mib,
        "share": round(process.used_mib / total, 4) if total and process.used_mib is not None else None,
        "command": process.command,
    }


@node_check(
    "gpu.remapped_rows",
    proves="no GPU has a row remap pending (it needs a reset) or a failed remap (it ran out of spare rows)",
    fix="A pending remap is applied by a GPU reset (nvidia-smi -r, or reboot); a remapping failure means the GPU "
    "must be replaced (NVIDIA's memory error management guide).",
    needs_gpu=True,
)
def gpu_remapped_rows(facts: NodeFacts) -> Finding:
    assert facts.smi is not None
    gpus = facts.smi.gpus
    rows = {g.bus_id: {"pending": g.remap_pending, "failure": g.remap_failure} for g in gpus}
    failed = [g.bus_id for g in gpus if g.remap_failure]
    pending = [g.bus_id for g in gpus if g.remap_pending]
    if failed:
        return fail(
            f"row remapping failed on {', '.join(failed)}: no spare rows left, the GPU must be replaced",
            "Drain the node and replace the GPU (a remapping failure is permanent).",
            remapped_rows=rows,
        )
    if pending:
        return fail(
            f"row remap pending on {', '.join(pending)}: a GPU reset applies it",
            "Drain the node and reset the GPU (nvidia-smi -r -i <id>) or reboot.",
            remapped_rows=rows,
        )
    if all(g.remap_pending is None for g in gpus):
        return skip("row remapping not reported (GPUs before Ampere have no row remapping)")
    return passed("no row remap pending or failed", remapped_rows=rows)


@node_check(
    "gpu.power_clocks",
    proves="no GPU runs under a power cap below its board's default or with application clocks lowered",
    fix="Restore the defaults: nvidia-smi -pl <default W> -i <id> and nvidia-smi -rac -i <id> (or reboot), and "
    "find what lowered them (a site script, a previous job).",
    needs_gpu=True,
)
def gpu_power_clocks(facts: NodeFacts) -> Finding:
    assert facts.smi is not None
    problems = []
    data = {}
    for g in facts.smi.gpus:
        data[g.bus_id] = {
            "power_limit_w": g.power_limit_w,
            "power_default_w": g.power_default_w,
            "app_clocks_mhz": g.app_clocks_mhz,
            "app_clocks_default_mhz": g.app_clocks_default_mhz,
        }
        if g.power_limit_w is not None and g.power_default_w and g.power_limit_w < g.power_default_w - 0.5:
            problems.append(f"{g.bus_id}: power cap {g.power_limit_w:g} W, default {g.power_default_w:g} W")
        for clock, default in g.app_clocks_default_mhz.items():
            current = g.app_clocks_mhz.get(clock)
            if current is not None and current < default:
                problems.append(f"{g.bus_id}: {clock.lower()} application clock {current} MHz, default {default} MHz")
    if problems:
        return warn("; ".join(problems), gpus=data)
    caps = sorted({g.power_limit_w for g in facts.smi.gpus if g.power_limit_w is not None})
    shown = f"power cap {', '.join(f'{c:g} W' for c in caps)}" if caps else "power cap not reported"
    return passed(f"{shown}, at the board default; application clocks at their defaults", gpus=data)


@node_check(
    "gpu.identity",
    proves="every GPU's UUID, serial number and VBIOS version are on record (the check data), so a GPU that "
    "comes back after repair is recognised",
    fix="A GPU without a UUID is not answering properly: check nvidia-smi -q and the kernel log.",
    needs_gpu=True,
)
def gpu_identity(facts: NodeFacts) -> Finding:
    assert facts.smi is not None
    gpus = {g.bus_id: {"uuid": g.uuid, "serial": g.serial, "vbios": g.vbios, "name": g.name} for g in facts.smi.gpus}
    unknown = [bus for bus, g in gpus.items() if not g["uuid"]]
    if unknown:
        return warn(f"no UUID reported for {', '.join(unknown)}", gpus=gpus)
    vbios = sorted({g["vbios"] or "?" for g in gpus.values()})
    return passed(f"{len(gpus)} GPU(s) identified, VBIOS {', '.join(vbios)}", gpus=gpus)


@node_check(
    "gpu.nvlink",
    proves="every NVLink of every GPU is active (nvidia-smi nvlink -s), and as many and as fast as the model's "
    "expected values say; a link down, missing or slow is named (a node with one GPU and no links: SKIP)",
    fix="An inactive NVLink makes NCCL route that GPU's traffic over PCIe: reset the GPU or reboot, check the "
    "kernel log for Xid 74 (NVLink error), and have the board or NVLink bridge serviced if it persists.",
    reads=("nvlink",),
    needs_gpu=True,
)
def gpu_nvlink(facts: NodeFacts) -> Finding:
    assert facts.nvlink is not None
    gpus = facts.nvlink
    match = facts.expected
    model = match.model
    want = model.get("nvlink_links") if model else None
    least = model.get("nvlink_link_gbps") if model else None
    links = sum(len(g["links"]) for g in gpus.values())
    if not links:
        if facts.smi is not None and len(facts.smi.gpus) < 2:
            # A GPU's NVLinks carry traffic to the node's other GPUs; a VM given one GPU of a board sees none.
            return skip("one GPU on this node: no NVLink to a peer GPU, none reported")
        if want:
            return warn(f"no NVLink reported, where {model.name} has {want} per GPU ({match.why})")
        return skip("no NVLink on this node's GPUs" + (f" ({match.why})" if model else ""))
    down = {
        index: sorted((link for link, state in g["links"].items() if state is None), key=int)
        for index, g in gpus.items()
    }
    down = {index: d for index, d in down.items() if d}
    problems = [f"GPU {i} ({gpus[i]['name']}): link(s) {', '.join(d)} inactive" for i, d in down.items()]
    if want:
        problems += [
            f"GPU {i} ({g['name']}): {len(g['links'])} NVLink(s) reported, where {model.name} has {want}"
            for i, g in gpus.items()
            if len(g["links"]) < want
        ]
    if least:
        slow = {
            index: [f"{link} at {speed}" for link, speed in g["links"].items() if (_gbps(speed) or least) < least]
            for index, g in gpus.items()
        }
        problems += [
            f"GPU {i} ({gpus[i]['name']}): link(s) {', '.join(s)}, below {least:g} GB/s" for i, s in slow.items() if s
        ]
    data = {"links": {index: g["links"] for index, g in gpus.items()}, "inactive": down, "expected_links": want}
    if problems:
        return warn("; ".join(problems) + (f" ({match.why})" if model else ""), **data)
    speeds = sorted({s for g in gpus.values() for s in g["links"].values() if s})
    judged = match.why if model else match.fallback("links judged by their state only")
    return passed(f"{links} NVLink(s) active on {len(gpus)} GPU(s) ({', '.join(speeds)}); {judged}", **data)


def _gbps(speed: str | None) -> float | None:
    """'26.562 GB/s' (nvidia-smi nvlink -s) -> 26.562."""
    try:
        return float((speed or "").split()[0])
    except (IndexError, ValueError):
        return None


@node_check(
    "gpu.nvlink_errors",
    proves="no NVLink of any GPU has counted replay, recovery or CRC errors (nvidia-smi nvlink -e); a link that "
    "has is named with its counters",
    fix="NVLink error counters count since the driver loaded: CRC errors and the replays that correct them mean a "
    "marginal link, recovery errors a link that dropped and retrained. Run the collectives stage again and "
    "compare the counters: if they grow under load, drain the node, reset the GPU or reboot, and have the board or "
    "NVSwitch tray serviced if they keep growing.",
    reads=("nvlink_errors",),
    needs_gpu=True,
)
def gpu_nvlink_errors(facts: NodeFacts) -> Finding:
    assert facts.nvlink_errors is not None
    gpus = facts.nvlink_errors
    links = sum(len(g["links"]) for g in gpus.values())
    if not links:
        return skip("no NVLink on this node's GPUs")
    errors = {
        index: {link: counters for link, counters in g["links"].items() if any(counters.values())}
        for index, g in gpus.items()
    }
    errors = {index: links for index, links in errors.items() if links}
    data = {"errors": errors}
    if not errors:
        return passed(f"no error counted on {links} NVLink(s) of {len(gpus)} GPU(s)", **data)
    detail = "; ".join(
        f"GPU {index} ({gpus[index]['name']}) link {link}: "
        + ", ".join(f"{count} {name.lower()}" for name, count in counters.items() if count)
        for index, links_with_errors in errors.items()
        for link, counters in sorted(links_with_errors.items(), key=lambda item: int(item[0]))
    )
    return warn(detail, **data)


DCGM_DEADLINES = {1: 120.0, 2: 900.0, 3: 3600.0}  # seconds dcgmi diag may take per level


@node_check(
    "gpu.dcgm",
    proves="NVIDIA's DCGM diagnostic (dcgmi diag -r LEVEL, with --dcgm-level 1|2|3) passes every test",
    fix="Read the failing test's message in hosts/<node>/dcgm-diag.txt and NVIDIA's DCGM diagnostics guide; "
    "a failing hardware test means draining the node and servicing the GPU.",
    needs_gpu=True,
)
def gpu_dcgm(facts: NodeFacts) -> Finding:
    diag = facts.dcgm
    if diag is None:
        if not facts.dcgmi:
            return skip("dcgmi is not installed on this node")
        return skip("DCGM diagnostic not asked for (--dcgm-level 1|2|3 runs it)")
    data = {"level": diag.level, "tests": diag.tests, "metadata": diag.metadata}
    if diag.error:
        return fail(f"dcgmi diag -r {diag.level}: {diag.error}", **data)
    if not diag.tests:
        return fail(f"dcgmi diag -r {diag.level} reported no test result", **data)
    failed = [t for t in diag.tests if t["result"].startswith("Fail")]
    warned = [t for t in diag.tests if t["result"].startswith("Warn")]

    def named(tests: list[dict]) -> str:
        return "; ".join(f"{t['test']}: {t['result']}" + (f" ({t['info']})" if t.get("info") else "") for t in tests)

    if failed:
        return fail(f"DCGM level {diag.level}: {named(failed)}", **data)
    if warned:
        return warn(f"DCGM level {diag.level}: {named(warned)}", **data)
    ran = [t for t in diag.tests if t["result"].startswith("Pass")]
    return passed(f"DCGM level {diag.level}: {len(ran)} test(s) pass, {len(diag.tests) - len(ran)} skipped", **data)
