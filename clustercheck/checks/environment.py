"""The node's Python environment: the python clustercheck found, and the torch it imports."""

from __future__ import annotations

from clustercheck.checks.registry import Finding, fail, node_check, passed, skip
from clustercheck.facts.model import NodeFacts
from clustercheck.model import Status


@node_check(
    "python.env",
    proves="the environment's python (inventory, /etc/clustercheck/python or --python) exists and runs",
    fix="Run the setup playbook (ansible-playbook site.yml) or fix clustercheck_python in the inventory.",
)
def python_env(facts: NodeFacts) -> Finding:
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
    if problem or facts.torch is None:
        python = facts.python_missing or facts.python
        return fail(
            f"torch does not import with {python}: {problem}",
            f"Install PyTorch into that environment ({facts.python} -m pip install torch), or point "
            "clustercheck_python / --python at the environment that has it.",
            python=facts.python,
            error=problem,
        )
    torch = facts.torch
    versions = {p.name: p.version for p in facts.packages}
    broken = [p for p in facts.packages if p.error]
    if broken:
        first = broken[0]
        what = f"{first.name} {first.version}" if first.version else first.name
        return fail(
            f"{what} does not import with {facts.python}: {first.error}"
            + (f" (and {', '.join(p.name for p in broken[1:])})" if broken[1:] else ""),
            f"Install {first.name} built for this torch ({torch.version}) into that environment, from the same "
            "index or wheelhouse as torch (the setup playbook's python_env role checks every package imports), "
            "or remove it.",
            python=facts.python,
            torch=torch.version,
            packages=versions,
            broken={p.name: p.error for p in broken},
        )
    vision = next((p for p in facts.packages if p.name == "torchvision"), None)
    mismatch = torchvision_mismatch(torch.version, vision) if vision else None
    if mismatch:
        return fail(
            mismatch,
            "Install the torchvision release paired with this torch, from the same index (CUDA variant) as torch.",
            python=facts.python,
            torch=torch.version,
            packages=versions,
        )
    others = f", with {', '.join(f'{n} {v}' for n, v in versions.items())}" if versions else ""
    return passed(
        f"torch {torch.version} imports with {facts.python}{others}",
        packages=versions,
        python=facts.python,
        torch=torch.version,
        cuda=torch.cuda_available,
        gpus=torch.device_count,
        cuda_version=torch.cuda,
        nccl=torch.nccl,
        cudnn=torch.cudnn,
    )


@node_check(
    "torch.cuda",
    proves="on a GPU node, torch sees the GPUs through CUDA and has NCCL",
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
    if not torch.cuda_available:
        build = "a CPU-only build" if not torch.cuda else f"built for CUDA {torch.cuda}"
        return fail(f"torch.cuda.is_available() is False (torch is {build})", **data)
    if not torch.nccl_backend or torch.nccl is None:
        return Finding(
            Status.FAIL,
            f"CUDA works but NCCL is not available in torch ({torch.nccl_error or 'no NCCL'})",
            "Install a torch build with NCCL (the official Linux CUDA wheels have it).",
            data,
        )
    return passed(f"CUDA {torch.cuda}, {torch.device_count} device(s), NCCL {torch.nccl}, cuDNN {torch.cudnn}", **data)
