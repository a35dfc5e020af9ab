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


@node_check(
    "torch.import",
    proves="torch imports in the node's environment (and what build it is)",
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
    return passed(
        f"torch {torch.version} imports with {facts.python}",
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
