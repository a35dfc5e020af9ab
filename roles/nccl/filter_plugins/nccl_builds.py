"""Choose NCCL's build for a CUDA toolkit from the versions a repository offers.

NVIDIA builds each NCCL release for a few CUDA minor versions only (2.27.x: +cuda12.4, +cuda12.9,
+cuda13.0, none for 12.8), so the build cannot be named from the toolkit's version. A build runs on
the toolkit's CUDA major at any minor not below its own: take the newest release, then the highest
such minor.
"""

from __future__ import annotations

import re

BUILD = re.compile(r"^(?P<release>(?P<upstream>\d+(?:\.\d+)*)-\d+)\+cuda(?P<major>\d+)\.(?P<minor>\d+)$")


def _numbers(text: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", text))


def _matches(release: str, wanted: str) -> bool:
    return not wanted or release == wanted or release.startswith(wanted + ".") or release.startswith(wanted + "-")


def nccl_builds(versions, cuda_version: str, nccl_version: str = "") -> list[str]:
    """The versions of VERSIONS (apt's, e.g. 2.27.7-1+cuda12.9) that fit CUDA_VERSION (major.minor), newest first.

    NCCL_VERSION narrows them: a full version (with +cuda) is taken as it is when offered, a release
    (2.27.7-1) or its prefix (2.27) keeps the builds of that release.
    """
    nccl_version = str(nccl_version or "").strip()
    offered = sorted({str(v).strip() for v in versions if str(v).strip()})
    if "+cuda" in nccl_version:
        return [nccl_version] if nccl_version in offered else []
    major, _, minor = str(cuda_version).partition(".")
    fitting = []
    for version in offered:
        build = BUILD.match(version)
        if not build or build["major"] != major or int(build["minor"]) > int(minor or 0):
            continue
        if _matches(build["release"], nccl_version):
            fitting.append((_numbers(build["release"]), int(build["minor"]), version))
    return [version for *_, version in sorted(fitting, reverse=True)]


def cuda_builds(versions) -> list[str]:
    """Every NCCL build in VERSIONS (for the error message when none fits)."""
    return sorted({str(v).strip() for v in versions if BUILD.match(str(v).strip())}, key=_numbers)


class FilterModule:
    def filters(self):
        return {"nccl_builds": nccl_builds, "nccl_all_builds": cuda_builds}
