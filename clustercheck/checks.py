"""Per-node checks: each turns one node's collected facts into one CheckResult. Pure logic, no I/O.

A check is a small function `check_x(ctx) -> CheckResult`; CHECKS lists them in
report order. GPU checks SKIP on a node without a GPU unless the inventory says
GPUs are expected there (gpus_per_node).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from clustercheck import facts as parse
from clustercheck.inventory import Node
from clustercheck.model import CheckResult, Status

GIB = 1 << 30
COULD_NOT_COLLECT = "could not collect"


@dataclass
class NodeFacts:
    """What was gathered on one node, as the checks see it."""

    node: Node
    python: str  # the python the collector ran with
    python_source: str  # how it was chosen: inventory, /etc/clustercheck/python, --python, python3, ...
    python_missing: str | None = None  # the configured python that does not exist, when we fell back
    raw: dict[str, Any] = field(default_factory=dict)  # worker/facts.py's JSON
    cluster_size: int = 1
    clock_offset: float | None = None  # node clock minus control clock, seconds
    clock_uncertainty: float | None = None

    @property
    def host(self) -> str:
        return self.node.name

    def command(self, name: str) -> dict[str, Any]:
        return self.raw.get("commands", {}).get(name, {"error": "not collected"})

    @property
    def smi(self) -> parse.NvidiaSmi | None:
        """nvidia-smi -q, parsed; None when nvidia-smi is not there or failed."""
        out = self.command("nvidia_smi_q")
        if out.get("rc") == 0 and out.get("out"):
            return parse.parse_nvidia_smi_q(out["out"])
        return None

    @property
    def torch(self) -> dict[str, Any]:
        value = self.raw.get("torch")
        return value if isinstance(value, dict) else {"error": COULD_NOT_COLLECT}

    @property
    def gpus_present(self) -> int:
        smi = self.smi
        return len(smi.gpus) if smi else 0

    @property
    def gpu_expected(self) -> bool:
        return bool(self.node.gpus_expected)


def result(ctx: NodeFacts, name: str, status: Status, message: str, remediation: str = "", **data: Any) -> CheckResult:
    return CheckResult(name, status, f"{ctx.host}: {message}", host=ctx.host, remediation=remediation, data=data)


# ----------------------------------------------------------------------------- environment


def check_python(ctx: NodeFacts) -> CheckResult:
    version = ctx.raw.get("python", {}).get("version")
    if ctx.python_missing:
        return result(
            ctx,
            "python.env",
            Status.FAIL,
            f"the environment's python {ctx.python_missing} ({ctx.python_source}) does not exist",
            "Run the setup playbook (ansible-playbook site.yml) or fix clustercheck_python in the inventory.",
            python=ctx.python_missing,
            source=ctx.python_source,
        )
    return result(
        ctx,
        "python.env",
        Status.PASS,
        f"{ctx.python} (Python {version}, from {ctx.python_source})",
        python=ctx.python,
        version=version,
        source=ctx.python_source,
    )


def check_torch(ctx: NodeFacts) -> CheckResult:
    torch = ctx.torch
    if "error" in torch or ctx.python_missing:
        cause = torch.get("error", COULD_NOT_COLLECT)
        return result(
            ctx,
            "torch.import",
            Status.FAIL,
            f"torch does not import with {ctx.python_missing or ctx.python}: {cause}",
            f"Install PyTorch into that environment ({ctx.python} -m pip install torch), or point "
            "clustercheck_python / --python at the environment that has it.",
            python=ctx.python,
            error=cause,
        )
    return result(
        ctx,
        "torch.import",
        Status.PASS,
        f"torch {torch.get('version')} imports with {ctx.python}",
        python=ctx.python,
        torch=torch.get("version"),
        cuda=torch.get("cuda_available"),
        gpus=torch.get("device_count"),
        cuda_version=torch.get("cuda"),
        nccl=torch.get("nccl"),
        cudnn=torch.get("cudnn"),
    )


def check_torch_cuda(ctx: NodeFacts) -> CheckResult:
    torch = ctx.torch
    if not ctx.gpus_present and not ctx.gpu_expected:
        return result(ctx, "torch.cuda", Status.SKIP, "no NVIDIA GPU on this node (none expected)")
    if "error" in torch:
        return result(ctx, "torch.cuda", Status.SKIP, "torch does not import")
    data = {k: torch.get(k) for k in ("cuda", "cuda_available", "device_count", "nccl", "cudnn")}
    if not torch.get("cuda_available"):
        build = "a CPU-only build" if not torch.get("cuda") else f"built for CUDA {torch.get('cuda')}"
        return result(
            ctx,
            "torch.cuda",
            Status.FAIL,
            f"torch.cuda.is_available() is False (torch is {build})",
            "Install the CUDA build of torch that matches the driver (PyTorch's index for your CUDA version), "
            "and check nvidia-smi works.",
            **data,
        )
    if not torch.get("nccl_backend") or torch.get("nccl") is None:
        return result(
            ctx,
            "torch.cuda",
            Status.FAIL,
            f"CUDA works but NCCL is not available in torch ({torch.get('nccl_error', 'no NCCL')})",
            "Install a torch build with NCCL (the official Linux CUDA wheels have it).",
            **data,
        )
    return result(
        ctx,
        "torch.cuda",
        Status.PASS,
        f"CUDA {torch.get('cuda')}, {torch.get('device_count')} device(s), NCCL {torch.get('nccl')}, "
        f"cuDNN {torch.get('cudnn')}",
        **data,
    )


# ----------------------------------------------------------------------------- GPUs


def _no_gpu(ctx: NodeFacts, name: str) -> CheckResult | None:
    """SKIP when there is no GPU and none is expected; FAIL-free otherwise (gpu.count reports the absence)."""
    if ctx.smi is None:
        if ctx.gpu_expected:
            return result(ctx, name, Status.SKIP, "nvidia-smi did not answer (see gpu.count)")
        return result(ctx, name, Status.SKIP, "no NVIDIA GPU on this node (none expected)")
    return None


def check_gpu_count(ctx: NodeFacts) -> CheckResult:
    expected = ctx.node.gpus_expected
    smi_out = ctx.command("nvidia_smi_q")
    smi = ctx.smi
    if smi is None:
        if not expected:
            return result(
                ctx, "gpu.count", Status.SKIP, "no NVIDIA GPU on this node (none expected)", expected=expected
            )
        cause = smi_out.get("error") or (smi_out.get("err") or smi_out.get("out") or "").strip().splitlines()[-1:]
        return result(
            ctx,
            "gpu.count",
            Status.FAIL,
            f"{expected} GPU(s) expected, but nvidia-smi does not answer: {cause or COULD_NOT_COLLECT}",
            "Install the NVIDIA driver (the setup playbook's driver role) and reboot; check `nvidia-smi`.",
            expected=expected,
            found=0,
        )
    found = len(smi.gpus)
    names = sorted({g.name or "?" for g in smi.gpus})
    data = {"expected": expected, "found": found, "names": names}
    if expected is not None and found != expected:
        return result(
            ctx,
            "gpu.count",
            Status.FAIL,
            f"{found} GPU(s) found, {expected} expected ({', '.join(names)})",
            "A missing GPU has fallen off the bus or is not seated: check `nvidia-smi -L`, the kernel log "
            "(Xid 79) and reboot; otherwise fix gpus_per_node in the inventory.",
            **data,
        )
    return result(ctx, "gpu.count", Status.PASS, f"{found} GPU(s): {', '.join(names)}", **data)


def check_gpu_driver(ctx: NodeFacts) -> CheckResult:
    skipped = _no_gpu(ctx, "gpu.driver")
    if skipped:
        return skipped
    smi = ctx.smi
    assert smi is not None
    if not smi.driver:
        return result(ctx, "gpu.driver", Status.FAIL, "nvidia-smi reports no driver version", "Reinstall the driver.")
    return result(
        ctx, "gpu.driver", Status.PASS, f"driver {smi.driver}, CUDA {smi.cuda}", driver=smi.driver, cuda=smi.cuda
    )


def check_gpu_persistence(ctx: NodeFacts) -> CheckResult:
    skipped = _no_gpu(ctx, "gpu.persistence")
    if skipped:
        return skipped
    off = [g.bus_id for g in ctx.smi.gpus if g.persistence != "Enabled"]  # type: ignore[union-attr]
    if off:
        return result(
            ctx,
            "gpu.persistence",
            Status.WARN,
            f"persistence mode is off on {len(off)} GPU(s) ({', '.join(off)})",
            "Enable the persistence daemon: systemctl enable --now nvidia-persistenced.",
            off=off,
        )
    return result(ctx, "gpu.persistence", Status.PASS, "persistence mode on for every GPU")


def check_gpu_ecc(ctx: NodeFacts) -> CheckResult:
    skipped = _no_gpu(ctx, "gpu.ecc")
    if skipped:
        return skipped
    counts = {g.bus_id: g.ecc_uncorrected for g in ctx.smi.gpus}  # type: ignore[union-attr]
    bad = {bus: n for bus, n in counts.items() if n}
    if bad:
        return result(
            ctx,
            "gpu.ecc",
            Status.FAIL,
            "uncorrectable ECC errors: " + ", ".join(f"{bus}: {n}" for bus, n in bad.items()),
            "Drain the node, reset the GPU (nvidia-smi -r) or reboot; replace the GPU if the errors return.",
            uncorrected=counts,
        )
    if all(n is None for n in counts.values()):
        return result(ctx, "gpu.ecc", Status.PASS, "ECC not reported (off or not supported)", uncorrected=counts)
    return result(ctx, "gpu.ecc", Status.PASS, "no uncorrectable ECC errors", uncorrected=counts)


def check_gpu_xid(ctx: NodeFacts) -> CheckResult:
    skipped = _no_gpu(ctx, "gpu.xid")
    if skipped:
        return skipped
    log = ctx.command("kernel_log")
    if log.get("rc") != 0 or not log.get("out"):
        log = ctx.command("dmesg")
    if log.get("rc") != 0:
        return result(
            ctx,
            "gpu.xid",
            Status.WARN,
            f"kernel log: {COULD_NOT_COLLECT} ({log.get('error') or (log.get('err') or '').strip()})",
            "Run clustercheck as a user that can read the kernel log (root, or the adm/systemd-journal group).",
        )
    xids = parse.parse_xids(log.get("out", ""))
    if xids:
        codes = sorted({x["xid"] for x in xids})
        return result(
            ctx,
            "gpu.xid",
            Status.WARN,
            f"{len(xids)} Xid error(s) in the kernel log (Xid {', '.join(map(str, codes))}); last: {xids[-1]['line']}",
            "Look the Xid codes up in NVIDIA's Xid catalog; 48/63/64/79/94/95 need a GPU reset or reboot.",
            xids=xids[-20:],
        )
    return result(ctx, "gpu.xid", Status.PASS, "no Xid errors in the kernel log")


def check_gpu_throttle(ctx: NodeFacts) -> CheckResult:
    skipped = _no_gpu(ctx, "gpu.throttle")
    if skipped:
        return skipped
    throttled = {g.bus_id: g.throttle_active for g in ctx.smi.gpus if g.throttle_active}  # type: ignore[union-attr]
    if throttled:
        detail = "; ".join(f"{bus}: {', '.join(r)}" for bus, r in throttled.items())
        return result(
            ctx,
            "gpu.throttle",
            Status.WARN,
            f"clocks throttled by hardware protection ({detail})",
            "Check cooling and power delivery (nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER).",
            throttled=throttled,
        )
    return result(ctx, "gpu.throttle", Status.PASS, "no thermal or power-brake throttling")


def check_fabric_manager(ctx: NodeFacts) -> CheckResult:
    switches = ctx.raw.get("nvswitches")
    if not isinstance(switches, int) or switches == 0:
        return result(ctx, "gpu.fabricmanager", Status.SKIP, "no NVSwitch on this node")
    service = ctx.command("fabricmanager").get("out", "").strip() or COULD_NOT_COLLECT
    smi = ctx.smi
    states = {g.bus_id: (g.fabric_state, g.fabric_status) for g in (smi.gpus if smi else [])}
    bad = {bus: s for bus, s in states.items() if s[0] not in (None, "Completed") or s[1] not in (None, "Success")}
    if service != "active" or bad:
        cause = f"nvidia-fabricmanager is {service}" if service != "active" else "fabric not trained"
        return result(
            ctx,
            "gpu.fabricmanager",
            Status.FAIL,
            f"{switches} NVSwitch(es), {cause}" + (f" ({len(bad)} GPU(s) not Completed/Success)" if bad else ""),
            "Install nvidia-fabricmanager matching the driver version exactly and systemctl enable --now it.",
            service=service,
            fabric=states,
        )
    return result(ctx, "gpu.fabricmanager", Status.PASS, f"{switches} NVSwitch(es), fabric manager active")


def check_gpu_processes(ctx: NodeFacts) -> CheckResult:
    skipped = _no_gpu(ctx, "gpu.processes")
    if skipped:
        return skipped
    busy = {g.bus_id: g.processes for g in ctx.smi.gpus if g.processes}  # type: ignore[union-attr]
    if busy:
        pids = sorted({p for procs in busy.values() for p in procs})
        return result(
            ctx,
            "gpu.processes",
            Status.WARN,
            f"{len(pids)} process(es) already use the GPUs (pid {', '.join(pids)})",
            "Stop them before training or benchmarking (nvidia-smi shows which), or expect lower numbers.",
            processes=busy,
        )
    return result(ctx, "gpu.processes", Status.PASS, "no process on the GPUs")


# ----------------------------------------------------------------------------- system


def check_os(ctx: NodeFacts) -> CheckResult:
    info = ctx.raw.get("os", {})
    if "error" in info or not info:
        return result(ctx, "os.info", Status.WARN, f"OS facts: {COULD_NOT_COLLECT} ({info.get('error')})")
    mem = info.get("mem_total_bytes")
    return result(
        ctx,
        "os.info",
        Status.PASS,
        f"{info.get('pretty_name')}, kernel {info.get('kernel')}, {info.get('cpus')} CPU(s), "
        f"{(mem or 0) / GIB:.1f} GiB RAM",
        **info,
    )


def check_shm(ctx: NodeFacts, minimum: int = 1 * GIB) -> CheckResult:
    shm = ctx.raw.get("shm", {})
    if "error" in shm or not shm:
        return result(ctx, "shm.size", Status.WARN, f"/dev/shm: {COULD_NOT_COLLECT} ({shm.get('error')})")
    total = shm.get("total_bytes") or 0
    if total < minimum:
        return result(
            ctx,
            "shm.size",
            Status.WARN,
            f"/dev/shm is {total / GIB:.2f} GiB, less than {minimum / GIB:.0f} GiB",
            "NCCL and DataLoader workers use /dev/shm: enlarge it (a tmpfs size= option; in containers --shm-size).",
            total_bytes=total,
        )
    return result(ctx, "shm.size", Status.PASS, f"/dev/shm is {total / GIB:.1f} GiB", total_bytes=total)


def check_memlock(ctx: NodeFacts) -> CheckResult:
    limit = ctx.raw.get("memlock", {})
    if "error" in limit or not limit:
        return result(ctx, "ulimit.memlock", Status.WARN, f"ulimit -l: {COULD_NOT_COLLECT}")
    soft = limit.get("soft")
    if soft is not None:
        return result(
            ctx,
            "ulimit.memlock",
            Status.WARN,
            f"ulimit -l is {soft // 1024} KiB, not unlimited",
            "RDMA (InfiniBand/RoCE) needs pinned memory: set `* - memlock unlimited` in "
            "/etc/security/limits.d/ and LimitMEMLOCK=infinity for services.",
            soft=soft,
            hard=limit.get("hard"),
        )
    return result(ctx, "ulimit.memlock", Status.PASS, "ulimit -l is unlimited")


def check_disk(ctx: NodeFacts, warn_below: int = 10 * GIB, fail_below: int = 1 * GIB) -> CheckResult:
    spaces = [ctx.raw.get("disk_root", {}), ctx.raw.get("disk_tmp", {})]
    known = [s for s in spaces if "free_bytes" in s]
    if not known:
        return result(ctx, "disk.free", Status.WARN, f"free disk: {COULD_NOT_COLLECT}")
    lowest = min(known, key=lambda s: s["free_bytes"])
    free = {s["path"]: s["free_bytes"] for s in known}
    text = ", ".join(f"{path} {n / GIB:.1f} GiB" for path, n in free.items())
    if lowest["free_bytes"] < fail_below:
        status = Status.FAIL
    elif lowest["free_bytes"] < warn_below:
        status = Status.WARN
    else:
        return result(ctx, "disk.free", Status.PASS, f"free: {text}", free_bytes=free)
    return result(
        ctx,
        "disk.free",
        status,
        f"low free disk: {text}",
        "Free space on that file system (checkpoints, caches and core dumps fill it).",
        free_bytes=free,
    )


def check_time_sync(ctx: NodeFacts) -> CheckResult:
    timedatectl = ctx.command("timedatectl")
    chronyc = ctx.command("chronyc")
    data: dict[str, Any] = {"offset_from_control_s": ctx.clock_offset, "measurement_error_s": ctx.clock_uncertainty}
    synced = None
    if timedatectl.get("rc") == 0:
        data.update(parse.parse_timedatectl(timedatectl.get("out", "")))
        synced = data.get("NTPSynchronized") == "yes"
    if chronyc.get("rc") == 0:
        tracking = parse.parse_chronyc_tracking(chronyc.get("out", ""))
        data["chrony"] = tracking
        synced = synced or tracking.get("leap_status") == "Normal"
    if synced is None:
        return result(
            ctx,
            "time.sync",
            Status.WARN,
            f"time sync state: {COULD_NOT_COLLECT} (no timedatectl or chronyc answer)",
            "Install and enable chrony (the setup playbook does).",
        )
    if not synced:
        return result(
            ctx,
            "time.sync",
            Status.WARN,
            "the clock is not synchronized to NTP",
            "Enable time sync: apt-get install chrony && systemctl enable --now chrony.",
            **data,
        )
    return result(ctx, "time.sync", Status.PASS, "clock synchronized to NTP", **data)


def check_hostname(ctx: NodeFacts) -> CheckResult:
    info = ctx.raw.get("hostname", {})
    name = info.get("hostname", "?")
    if "error" in info or not info.get("addresses"):
        return result(
            ctx,
            "hostname.resolve",
            Status.FAIL if ctx.cluster_size > 1 else Status.WARN,
            f"hostname {name} {info.get('error', 'does not resolve')}",
            "Add the node's cluster address for its hostname to /etc/hosts (the setup playbook does).",
            hostname=name,
        )
    addresses = info["addresses"]
    loopback = [a for a in addresses if a.startswith("127.") or a == "::1"]
    if len(loopback) == len(addresses):
        if ctx.cluster_size == 1:
            return result(
                ctx,
                "hostname.resolve",
                Status.WARN,
                f"hostname {name} resolves to loopback ({', '.join(addresses)}): fine on one node, "
                "breaks rendezvous across nodes",
                "Map the hostname to the node's cluster address in /etc/hosts before adding nodes.",
                hostname=name,
                addresses=addresses,
            )
        return result(
            ctx,
            "hostname.resolve",
            Status.FAIL,
            f"hostname {name} resolves only to loopback ({', '.join(addresses)}); other ranks cannot reach it",
            f"In /etc/hosts, map {name} to the node's cluster address, not 127.0.1.1 (the setup playbook does).",
            hostname=name,
            addresses=addresses,
        )
    return result(
        ctx, "hostname.resolve", Status.PASS, f"hostname {name} resolves to {', '.join(addresses)}", hostname=name
    )


def check_firewall(ctx: NodeFacts) -> CheckResult:
    state = parse.firewall_state(ctx.command("ufw"), ctx.command("nft"), ctx.command("iptables"))
    if not state["collected"]:
        return result(
            ctx,
            "firewall",
            Status.WARN,
            f"firewall state: {COULD_NOT_COLLECT} (ufw, nft and iptables need root)",
            "Run clustercheck as root (ansible_user=root or a user with sudo) to see the firewall.",
        )
    if not state["active"]:
        return result(
            ctx,
            "firewall",
            Status.WARN,
            "no firewall is active: every port is open to every network",
            "Enable a firewall that allows the cluster network only (the setup playbook's firewall role).",
            **state,
        )
    return result(ctx, "firewall", Status.PASS, f"{state['tool']} active ({state['rules']} rule(s))", **state)


CHECKS: list[Callable[[NodeFacts], CheckResult]] = [
    check_os,
    check_python,
    check_torch,
    check_torch_cuda,
    check_gpu_count,
    check_gpu_driver,
    check_gpu_persistence,
    check_gpu_ecc,
    check_gpu_xid,
    check_gpu_throttle,
    check_fabric_manager,
    check_gpu_processes,
    check_shm,
    check_memlock,
    check_disk,
    check_time_sync,
    check_hostname,
    check_firewall,
]


def run_checks(ctx: NodeFacts) -> list[CheckResult]:
    """Every per-node check; a check that raises becomes an ERROR, never a crash."""
    results = []
    for check in CHECKS:
        try:
            results.append(check(ctx))
        except Exception as exc:
            name = check.__name__.removeprefix("check_")
            results.append(result(ctx, name, Status.ERROR, f"check {name} failed: {type(exc).__name__}: {exc}"))
    return results
