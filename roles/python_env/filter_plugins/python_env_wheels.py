"""Does a wheelhouse fit the node's Python? Pure logic, used by the python_env role before pip runs.

pip, given wheels for another Python, says only "No matching distribution found for torch==...".
The role asks first, and says which Python the node has, which the wheels are for, and the
`pip download` line that builds the right wheelhouse.
"""

from __future__ import annotations

import re

WHEEL = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+)(-\d[^-]*)?-(?P<py>[^-]+)-(?P<abi>[^-]+)-(?P<plat>[^-]+)\.whl$")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_wheel(filename: str) -> dict | None:
    """name, version, and the python/abi/platform tag sets of a wheel file name (PEP 427), or None."""
    m = WHEEL.match(filename)
    if not m:
        return None
    return {
        "name": _norm(m["name"]),
        "version": m["version"],
        "py": set(m["py"].split(".")),
        "abi": set(m["abi"].split(".")),
        "plat": set(m["plat"].split(".")),
        "tag": f"{m['py']}-{m['abi']}-{m['plat']}",
    }


def wheel_fits(wheel: dict, python_version: str, machine: str) -> bool:
    """Whether CPython PYTHON_VERSION ("3.11") on MACHINE ("x86_64") can install WHEEL."""
    major, minor = python_version.split(".")[:2]
    cp = f"cp{major}{minor}"
    stable_abi = "abi3" in wheel["abi"] and any(
        t.startswith(f"cp{major}") and int(t[3:] or 0) <= int(minor) for t in wheel["py"]
    )
    py_ok = bool(wheel["py"] & {cp, f"py{major}", f"py{major}{minor}"}) or stable_abi
    abi_ok = bool(wheel["abi"] & {cp, "none", "abi3"})
    plat_ok = "any" in wheel["plat"] or any(
        p.startswith(("linux_", "manylinux")) and p.endswith(f"_{machine}") for p in wheel["plat"]
    )
    return py_ok and abi_ok and plat_ok


def _version_matches(wheel_version: str, wanted: str) -> bool:
    return wheel_version == wanted or wheel_version.split("+")[0] == wanted


def wheelhouse_mismatch(
    wheels: list[str], requirements: dict[str, str], python_version: str, machine: str, hostname: str = "the node"
) -> str:
    """'' when WHEELS (file names) hold, for every NAME: VERSION of REQUIREMENTS, a wheel that installs on
    CPython PYTHON_VERSION on MACHINE; else one line saying what does not fit and how to build what does."""
    parsed = [w for w in (parse_wheel(f) for f in wheels) if w]
    for name, version in requirements.items():
        if not version:
            continue
        candidates = [w for w in parsed if w["name"] == _norm(name) and _version_matches(w["version"], version)]
        if any(wheel_fits(w, python_version, machine) for w in candidates):
            continue
        platform = f"manylinux_2_28_{machine}"
        fix = (
            f"pip download -d wheelhouse --only-binary=:all: --python-version {python_version} "
            f"--platform {platform} {name}=={version}"
        )
        if not candidates:
            return f"the wheelhouse has no {name}=={version} wheel; build one for {hostname} with: {fix}"
        tags = ", ".join(sorted({w["tag"] for w in candidates}))
        return (
            f"{hostname} has Python {python_version} on {machine}, but the wheelhouse's {name}=={version} wheels "
            f"are for {tags}; build a wheelhouse for it with: {fix}"
        )
    return ""


def python_too_old(python_version: str, minimum: str) -> bool:
    """Whether PYTHON_VERSION ("3.8") is older than MINIMUM ("3.10")."""
    return tuple(int(x) for x in python_version.split(".")[:2]) < tuple(int(x) for x in minimum.split(".")[:2])


class FilterModule:
    def filters(self):
        return {
            "python_env_wheelhouse_mismatch": wheelhouse_mismatch,
            "python_env_python_too_old": python_too_old,
        }
