"""The environment users' jobs see on a node: the python clustercheck found, the torch it imports, and the
NCCL_*/GLOO_* variables a user's own torchrun inherits from the node's configuration."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

from clustercheck.checks import torchinstall
from clustercheck.checks.registry import Finding, fail, node_check, passed, skip, warn
from clustercheck.facts import parse
from clustercheck.facts.model import NodeFacts
from clustercheck.model import Status


@node_check(
    "python.env",
    proves="the environment's python (inventory, /etc/clustercheck/python or --python) exists and runs",
    fix="Run the setup playbook (ansible-playbook site.yml) or fix clustercheck_python in the inventory.",
)
def python_env(facts: NodeFacts) -> Finding:
    if facts.image is not None:  # --container: the image's python
        if not facts.image.python:
            return skip(f"no python in image {facts.image.image} could be run (container.* says why)")
        return passed(
            f"{facts.environment} (Python {facts.python_version}, --container)",
            python=facts.image.python,
            version=facts.python_version,
            source=f"image {facts.image.image}",
        )
    if facts.python_missing:
        return fail(
            f"the environment's python {facts.python_missing} ({facts.python_source}) does not exist",
            python=facts.python_missing,
            source=facts.python_source,
        )
    return passed(
        f"{facts.python} (Python {facts.python_version}, from {facts.python_source})",
        python=facts.python,
        version=facts.python_version,
        source=facts.python_source,
    )


def torchvision_mismatch(torch_version: str, package) -> str | None:
    """Why torchvision's build does not match torch's (its CUDA variant, or the torch it was built for)."""
    variant = torch_version.partition("+")[2] or None
    theirs = (package.version or "").partition("+")[2] or None
    if variant and theirs and variant != theirs:
        return f"torchvision {package.version} is the {theirs} build, torch {torch_version} the {variant} build"
    base = torch_version.partition("+")[0]
    for requirement in package.requires_torch:
        pinned = requirement.split(";")[0].replace(" ", "").replace("(", "").replace(")", "")
        if pinned.startswith("torch==") and pinned[len("torch==") :].partition("+")[0] != base:
            return f"torchvision {package.version} was built for {pinned}, the environment has torch {torch_version}"
    return None


@node_check(
    "torch.import",
    proves="torch imports in the node's environment, and so do torchvision (when installed, built for that torch) "
    "and the packages the inventory lists in python_env_packages",
    fix="Install PyTorch into that environment (the setup playbook's python_env role), or point "
    "clustercheck_python / --python at the environment that has it.",
)
def torch_import(facts: NodeFacts) -> Finding:
    problem = facts.torch_problem
    if facts.image is not None and not facts.image.python:
        return skip(f"no python in image {facts.image.image} could be run (container.* says why)")
    if problem or facts.torch is None:
        python = facts.python_missing or facts.environment
        if facts.python_missing or (facts.image is not None and facts.image.problem):
            return fail(f"torch does not import with {python}: {problem}", python=facts.torch_python, error=problem)
        message, fix, cause = torchinstall.import_failure(
            python, facts.torch_python, str(problem), facts.raw.get("torch"), facts.image.image if facts.image else None
        )
        return fail(message, fix, python=facts.torch_python, **cause)
    torch = facts.torch
    versions = {p.name: p.version for p in facts.imports}
    broken = [p for p in facts.imports if p.error]
    if broken:
        first = broken[0]
        what = f"{first.name} {first.version}" if first.version else first.name
        return fail(
            f"{what} does not import with {facts.environment}: {first.error}"
            + (f" (and {', '.join(p.name for p in broken[1:])})" if broken[1:] else ""),
            f"Install {first.name} built for this torch ({torch.version}) into that environment, from the same "
            "index or wheelhouse as torch (the setup playbook's python_env role checks every package imports), "
            "or remove it.",
            python=facts.torch_python,
            torch=torch.version,
            packages=versions,
            broken={p.name: p.error for p in broken},
        )
    vision = next((p for p in facts.imports if p.name == "torchvision"), None)
    mismatch = torchvision_mismatch(torch.version, vision) if vision else None
    if mismatch:
        return fail(
            mismatch,
            "Install the torchvision release paired with this torch, from the same index (CUDA variant) as torch.",
            python=facts.torch_python,
            torch=torch.version,
            packages=versions,
        )
    others = f", with {', '.join(f'{n} {v}' for n, v in versions.items())}" if versions else ""
    reused = ""
    if torch.imported_at is not None:  # node-health's kept import (the collector's TorchProbe)
        at = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(torch.imported_at))
        reused = f" (as imported at {at}; its environment, driver and devices unchanged since)"
    return passed(
        f"torch {torch.version} imports with {facts.environment}{others}{reused}",
        packages=versions,
        python=facts.torch_python,
        torch=torch.version,
        cuda=torch.cuda_available,
        gpus=torch.device_count,
        cuda_version=torch.cuda,
        nccl=torch.nccl,
        cudnn=torch.cudnn,
        **({"imported_at": torch.imported_at} if reused else {}),
    )


# The oldest Linux driver each CUDA major release runs on through minor-version compatibility: a program built with
# any CUDA 12.x runs, with a limited feature set, on a driver of at least 525.60.13 even where that driver supports
# an older 12.x only. NVIDIA: "CUDA Compatibility", Minor Version Compatibility, and the CUDA Toolkit Release Notes'
# table "CUDA Toolkit and Minimum Required Driver Version for CUDA Minor Version Compatibility"
# (https://docs.nvidia.com/deploy/cuda-compatibility/minor-version-compatibility.html,
# https://docs.nvidia.com/cuda/cuda-toolkit-release-notes/). Before CUDA 11 there was none.
MINOR_VERSION_DRIVER = {11: "450.80.02", 12: "525.60.13", 13: "580"}
FORWARD_COMPAT = (
    "on a data-center GPU, NVIDIA's forward-compatibility package (cuda-compat-<major>-<minor>, on the library path) "
    "runs a newer CUDA on an older driver"
)


def _numbers(version: str | None) -> tuple[int, ...] | None:
    parts = re.findall(r"\d+", version or "")
    return tuple(int(p) for p in parts) or None


@dataclass(frozen=True)
class CudaSupport:
    """Whether a driver runs a program built for a CUDA release (cuda_support)."""

    status: Status  # PASS: supported; WARN: through minor-version compatibility only; FAIL: not supported
    message: str


def cuda_support(build: str, driver: str | None, driver_cuda: str | None) -> CudaSupport | None:
    """Whether the driver DRIVER (nvidia-smi's "Driver Version"), supporting CUDA DRIVER_CUDA (its "CUDA Version"),
    runs a program built for CUDA BUILD (torch.version.cuda, an image's CUDA_VERSION): supported up to its own
    CUDA version; within the same major release through minor-version compatibility when the driver is at least
    MINOR_VERSION_DRIVER's; else not (forward compatibility aside). None when a version cannot be read."""
    wanted, have, version = _numbers(build), _numbers(driver_cuda), _numbers(driver)
    if wanted is None or have is None or version is None:
        return None
    wanted, have = wanted[:2], have[:2]
    supports = f"driver {driver} supports CUDA {driver_cuda}"
    if wanted <= have:
        return CudaSupport(Status.PASS, f"built for CUDA {build}; {supports}")
    floor = MINOR_VERSION_DRIVER.get(wanted[0])
    if floor and wanted[0] == have[0] and version >= _numbers(floor):
        return CudaSupport(
            Status.WARN,
            f"built for CUDA {build}, newer than the CUDA {driver_cuda} that driver {driver} supports: it runs "
            f"through CUDA {wanted[0]}.x minor-version compatibility (driver >= {floor}), with a limited feature set "
            "(PTX JIT of newer code fails)",
        )
    need = f"CUDA {wanted[0]}.x needs driver >= {floor}" if floor else f"CUDA {build} needs a driver supporting it"
    return CudaSupport(Status.FAIL, f"built for CUDA {build}, but {supports} and {need}")


@dataclass(frozen=True)
class Hidden:
    """GPUs the environment hides from torch: what hides them and where it is set (hidden_gpus)."""

    message: str
    fix: str
    variables: dict[str, str]  # name -> value, in the environment torch ran in
    set_in: dict[str, list[str]]  # name -> the FILE:LINE that set it


def hidden_gpus(facts: NodeFacts) -> Hidden | None:
    """When torch sees fewer GPUs than nvidia-smi shows (or none) and the environment it ran in holds
    CUDA_VISIBLE_DEVICES (with --container, also NVIDIA_VISIBLE_DEVICES): that variable, its value and where the
    node sets it, as the cause. None when torch sees every GPU, or when nothing in the environment explains it."""
    torch, shown, visibility = facts.torch, facts.gpus_present, facts.gpu_visibility
    if torch is None or not shown or visibility is None or facts.gpus_for_torch >= shown:
        return None
    names = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES") if facts.image is not None else ("CUDA_VISIBLE_DEVICES",)
    variables = {name: visibility.environment[name] for name in names if name in visibility.environment}
    if not variables:
        return None
    set_in = {name: visibility.set_in(name) for name in variables}
    causes = []
    for name, value in variables.items():
        where = f"set in {', '.join(set_in[name])}" if set_in[name] else "in the environment the collector ran in"
        causes.append(f"{name}={value!r} ({where}){_names_no_gpu(value, facts)}")
    seen = facts.gpus_for_torch
    message = f"torch sees {seen} of the {shown} GPU(s) nvidia-smi shows: the environment hides them, " + "; ".join(
        causes
    )
    files = sorted({f.rsplit(":", 1)[0] for where in set_in.values() for f in where})
    there = ", ".join(files) if files else "the shell, service or SSH session that starts the jobs"
    fix = (
        f"Unset {' and '.join(variables)} in {there} (or set it to the GPUs the jobs should use): it hides GPUs from "
        "CUDA, so torch does not see them; torch's build is not the cause."
    )
    return Hidden(message, fix, variables, set_in)


def _names_no_gpu(value: str, facts: NodeFacts) -> str:
    """', which names no GPU of this node' when VALUE (a list of indices or UUIDs) names none that nvidia-smi shows."""
    gpus = facts.smi.gpus if facts.smi else []
    known = {str(i) for i in range(len(gpus))} | {g.uuid for g in gpus if g.uuid}
    wanted = [v.strip() for v in value.split(",") if v.strip()]
    if any(w in known or any(u.startswith(w) for u in known if u.startswith("GPU-")) for w in wanted):
        return ""
    return f", which names no GPU of this node (it has GPU {', '.join(str(i) for i in range(len(gpus)))})"


@node_check(
    "torch.cuda",
    proves="on a GPU node, torch sees the GPUs through CUDA and has NCCL; when it sees fewer than nvidia-smi shows, "
    "or none, and CUDA_VISIBLE_DEVICES is set, that variable (its value and where the node sets it) is named as the "
    "cause",
    fix="Install the CUDA build of torch that matches the driver (PyTorch's index for your CUDA version), "
    "and check nvidia-smi works.",
)
def torch_cuda(facts: NodeFacts) -> Finding:
    if not facts.gpus_present and not facts.gpu_expected:
        return skip("no NVIDIA GPU on this node (none expected)")
    torch = facts.torch
    if torch is None:
        return skip("torch does not import")
    data = {
        "cuda": torch.cuda,
        "cuda_available": torch.cuda_available,
        "device_count": torch.device_count,
        "nccl": torch.nccl,
        "cudnn": torch.cudnn,
    }
    hidden = hidden_gpus(facts)
    if hidden is not None:
        return fail(hidden.message, hidden.fix, **data, hidden_by=hidden.variables, set_in=hidden.set_in)
    if not torch.cuda_available:
        build = "a CPU-only build" if not torch.cuda else f"built for CUDA {torch.cuda}"
        smi = facts.smi
        support = cuda_support(torch.cuda, smi.driver, smi.cuda) if torch.cuda and smi else None
        if support is not None and support.status is Status.FAIL:
            return fail(f"torch.cuda.is_available() is False: torch is {support.message}", **data)
        return fail(f"torch.cuda.is_available() is False (torch is {build})", **data)
    if not torch.nccl_backend or torch.nccl is None:
        return Finding(
            Status.FAIL,
            f"CUDA works but NCCL is not available in torch ({torch.nccl_error or 'no NCCL'})",
            "Install a torch build with NCCL (the official Linux CUDA wheels have it).",
            data,
        )
    return passed(f"CUDA {torch.cuda}, {torch.device_count} device(s), NCCL {torch.nccl}, cuDNN {torch.cudnn}", **data)


@node_check(
    "torch.driver",
    proves="on a GPU node, the node's NVIDIA driver supports the CUDA release torch was built for (NVIDIA's minimum "
    "driver per CUDA major release for minor-version compatibility, forward compatibility noted)",
    fix="Install a driver that supports torch's CUDA (the setup playbook's nvidia_driver role, nvidia_driver_branch), "
    "or install torch built for a CUDA the driver supports (the python_env role's python_env_pytorch_variant).",
)
def torch_driver(facts: NodeFacts) -> Finding:
    if not facts.gpus_present and not facts.gpu_expected:
        return skip("no NVIDIA GPU on this node (none expected)")
    torch = facts.torch
    if torch is None:
        return skip("torch does not import")
    if not torch.cuda:
        return skip(f"torch {torch.version} is a CPU-only build (torch.cuda says why)")
    smi = facts.smi
    if smi is None or not smi.driver:
        return skip("the driver's version is not known (gpu.driver says why)")
    support = cuda_support(torch.cuda, smi.driver, smi.cuda)
    data = {"torch": torch.version, "cuda": torch.cuda, "driver": smi.driver, "driver_cuda": smi.cuda}
    if support is None:
        return skip(f"cannot compare CUDA {torch.cuda} with driver {smi.driver} (CUDA {smi.cuda})", **data)
    message = f"torch {torch.version} {support.message}"
    if support.status is Status.FAIL and torch.cuda_available:
        # torch works all the same: the forward-compatibility package must be in use
        return passed(f"{message}; yet CUDA works here, so forward compatibility is in use ({FORWARD_COMPAT})", **data)
    if support.status is Status.FAIL:
        return fail(f"{message} ({FORWARD_COMPAT})", **data)
    if support.status is Status.WARN:
        return warn(message, **data)
    return passed(message, **data)


IFNAME_VARIABLES = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")
# Interfaces that exist on many hosts but never carry traffic between nodes: container and VM bridges.
CONTAINER_BRIDGE = re.compile(
    r"^(docker\d+|br-[0-9a-f]{12}|virbr\d+|cni\d*|lxcbr\d+|lxdbr\d+|podman\d+|cali|flannel|veth)"
)


@node_check(
    "env.launch",
    proves="the NCCL_*/GLOO_* settings a user's own torchrun inherits from the node (/etc/environment, "
    "/etc/nccl.conf, /etc/profile.d) name interfaces and HCAs that exist, that are not loopback or a container "
    "bridge, and that include the cluster interface",
    fix="Correct or remove the variable in the file named; the cluster interface is the one the network stage "
    "uses (cluster_interface in the inventory names it).",
    reads=("launch_env", "netdevs"),
)
def env_launch(facts: NodeFacts) -> Finding:
    assert facts.launch_env is not None and facts.netdevs is not None
    settings = facts.launch_env
    data = {"settings": [f"{s.file}:{s.line}: {s.name}={s.value}" for s in settings], "interface": facts.interface}
    if not settings:
        return passed("no NCCL_* or GLOO_* variable set in the node's environment files", **data)
    fails: list[str] = []
    warns: list[str] = []
    for s in settings:
        where = f"{s.file} sets {s.name}={s.value}"
        if s.name in IFNAME_VARIABLES:
            problem, mild = _ifname_problem(s.name, s.value, facts)
            if problem:
                (warns if mild else fails).append(f"{where}: {problem}")
        elif s.name == "NCCL_IB_HCA":
            problem = _hca_problem(s.value, facts)
            if problem:
                fails.append(f"{where}: {problem}")
        elif s.name == "NCCL_IB_DISABLE" and s.value.strip() == "1":
            active = [p.name for p in facts.rdma_ports or [] if p.active]
            if active:
                warns.append(f"{where}: NCCL will not use the active RDMA port(s) {', '.join(active)}")
    if fails:
        return fail("; ".join(fails + warns), **data)
    if warns:
        return warn("; ".join(warns), **data)
    return passed(
        f"{len(settings)} NCCL_*/GLOO_* setting(s), every interface named exists: "
        + ", ".join(f"{s.name}={s.value}" for s in settings),
        **data,
    )


def _ifname_problem(name: str, value: str, facts: NodeFacts) -> tuple[str | None, bool]:
    """What is wrong with an interface list for NAME (None: nothing), and whether it is only a warning."""
    devs = facts.netdevs or {}
    exclude, exact, wanted = parse.parse_ifname_list(value)
    exact = exact or name == "GLOO_SOCKET_IFNAME"  # gloo takes interface names, not prefixes
    if not wanted:
        return "the value is empty", False

    def matches(pattern: str) -> list[str]:
        return sorted(d for d in devs if d == pattern or (not exact and d.startswith(pattern)))

    if exclude:
        cluster = facts.interface
        if cluster and any(cluster in matches(p) for p in wanted):
            return f"it excludes {cluster}, the cluster interface", False
        return None, False
    found = {p: matches(p) for p in wanted}
    absent = [p for p, m in found.items() if not m]
    have = ", ".join(sorted(devs)) or "none"
    if absent:
        return f"no interface {', '.join(absent)} on this node (it has {have})", False
    chosen = sorted({d for m in found.values() for d in m})
    loop = [d for d in chosen if devs[d].loopback]
    if loop:
        return f"{', '.join(loop)} is loopback: ranks on other nodes cannot reach it", False
    bridges = [d for d in chosen if CONTAINER_BRIDGE.match(d)]
    if bridges:
        return f"{', '.join(bridges)} is a container bridge, not the cluster network", False
    if facts.interface and facts.interface not in chosen:
        return f"the cluster network is on {facts.interface}, not {', '.join(chosen)}", True
    return None, False


def _hca_problem(value: str, facts: NodeFacts) -> str | None:
    exclude, exact, wanted = parse.parse_ifname_list(value)
    if exclude or facts.rdma_ports is None:
        return None
    devices = sorted({p.device for p in facts.rdma_ports})
    absent = [
        w
        for w in wanted
        if not any(d == w.split(":")[0] or (not exact and d.startswith(w.split(":")[0])) for d in devices)
    ]
    if absent:
        return f"no RDMA device {', '.join(absent)} on this node (it has {', '.join(devices) or 'none'})"
    return None
