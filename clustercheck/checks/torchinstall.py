"""Why torch does not import on a node, read from the import probe's answer (remote/torchprobe.py), and the fix for
each cause: a local file shadowing a module torch imports (rename it), a broken install (reinstall the same build),
torch missing (install the build the cluster runs). An install command always pins the build: an unpinned
`pip install torch` fetches PyPI's default build, a CUDA one of several GB, whatever the node needs.

torch.import (checks/environment.py) words the finding with `import_failure`; once every node's facts are in, the
run pins a missing torch to the build the other nodes run (`with_pinned_torch`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Any

from clustercheck.model import CheckResult, Status

INDEX = "https://download.pytorch.org/whl/"  # PyTorch's own index: one directory per build variant (cpu, cu128, ...)


def pinned_install(python: str, version: str, *, again: bool = False) -> str:
    """The pip command that installs torch VERSION (2.13.0+cpu, 2.7.1+cu128, 2.13.0) with PYTHON: a local version
    (+cpu, +cu128) comes from PyTorch's index for that variant; a plain one is PyPI's build of that version."""
    variant = version.partition("+")[2]
    command = f"{python} -m pip install {'--force-reinstall ' if again else ''}torch=={version}"
    return f"{command} --index-url {INDEX}{variant}" if variant else command


def cause(raw: Any) -> dict[str, Any]:
    """What the import probe's answer RAW (facts.raw["torch"]) says of a failed import: {"cause": shadowed, broken,
    missing or unknown, and what names it}."""
    raw = raw if isinstance(raw, dict) else {}
    error = str(raw.get("error") or "")
    shadow = raw.get("shadow")
    if isinstance(shadow, dict) and shadow.get("file"):
        return {"cause": "shadowed", "module": shadow.get("module"), "file": shadow["file"], "error": error}
    installed = raw.get("installed")
    if isinstance(installed, dict) and installed.get("version"):
        return {"cause": "broken", "version": installed["version"], "error": error}
    if error.startswith("ModuleNotFoundError") and "'torch'" in error:
        return {"cause": "missing", "error": error}
    return {"cause": "unknown", "error": error}


def missing_fix(python: str, version: str | None, image: str | None = None) -> str:
    """The fix for torch missing from PYTHON's environment, pinned to VERSION where the other nodes run one; in a
    container IMAGE the install belongs in the image (a package installed into a running container dies with it)."""
    install = pinned_install(python, version) if version else pinned_install(python, "VERSION+VARIANT")
    where = "the build the other nodes run" if version else "the build your jobs need (VARIANT: cpu, or cuXYZ for CUDA)"
    if image:
        return (
            f"Build an image FROM {image} with {where} installed (`RUN {install}`) and pass it to --container, or "
            "pass an image that has PyTorch."
        )
    return (
        f"Install {where} into that environment: `{install}` (the setup playbook's python_env role pins it), or "
        "point clustercheck_python / --python at the environment that has it."
    )


def import_failure(
    environment: str, python: str, problem: str, raw: Any, image: str | None = None
) -> tuple[str, str, dict[str, Any]]:
    """torch.import's FAIL for a torch that does not import in ENVIRONMENT (its PYTHON runs the fix; PROBLEM: why,
    as the facts say; IMAGE: the container image it ran in, if any): its message, its fix and its data, by cause."""
    found = cause(raw)
    if image:
        found["image"] = image
    if found["cause"] == "shadowed":
        module, path = found["module"], found["file"]
        return (
            f"torch does not import with {environment}: {path} shadows the module {module} that torch imports "
            f"({problem})",
            f"Rename {path} (or take its directory off PYTHONPATH): a file named like a module torch imports is found "
            "first.",
            found,
        )
    if found["cause"] == "broken":
        version = found["version"]
        return (
            f"torch {version} is installed for {environment} but does not import, a broken install: {problem}",
            f"Reinstall that build: `{pinned_install(python, version, again=True)}`.",
            found,
        )
    if found["cause"] == "missing":
        return f"torch is not installed for {environment}: {problem}", missing_fix(python, None, image), found
    return (
        f"torch does not import with {environment}: {problem}",
        "Run the import by hand to see the whole error "
        f"(`{python} -c 'import torch'`), or point clustercheck_python / --python at an environment where torch works.",
        found,
    )


def with_pinned_torch(results: list[CheckResult], versions: dict[str, str | None]) -> list[CheckResult]:
    """RESULTS, each torch.import FAIL for a missing torch with the fix pinned to the torch build most of the other
    nodes run (VERSIONS: node -> its torch version, None where torch does not import); unchanged where no other node
    has torch."""
    out = []
    for result in results:
        if result.name != "torch.import" or result.status is not Status.FAIL or result.data.get("cause") != "missing":
            out.append(result)
            continue
        others = Counter(v for node, v in versions.items() if v and node != result.host)
        if not others:
            out.append(result)
            continue
        version = others.most_common(1)[0][0]
        python = str(result.data.get("python") or "python3")
        out.append(
            replace(
                result,
                remediation=missing_fix(python, version, result.data.get("image")),
                data={**result.data, "pin": version},
            )
        )
    return out
