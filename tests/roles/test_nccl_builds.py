"""The nccl role's choice of NCCL build (roles/nccl/filter_plugins/nccl_builds.py), on the builds NVIDIA
publishes (tests/ansible/standins/SOURCES.md: 2.27.x for +cuda12.4, +cuda12.9 and +cuda13.0, none for 12.8)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(REPO / "tests" / "ansible" / "standins"))  # the stand-in repository the converges serve
import build_repo  # noqa: E402

_spec = importlib.util.spec_from_file_location("nccl_builds", REPO / "roles/nccl/filter_plugins/nccl_builds.py")
nccl = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(nccl)

OFFERED = [
    *build_repo.NCCL_BUILDS,  # the builds the stand-in repository serves to the converges
    "2.18.5-1-2",  # Ubuntu's own libnccl2 (universe): not a CUDA build, never chosen
]


def test_newest_release_for_a_toolkit_without_its_own_build():
    # CUDA 12.8: no 2.27 build for 12.8; the 12.4 build runs on it, and 2.27.7 beats 2.26.2+cuda12.8.
    assert nccl.nccl_builds(OFFERED, "12.8")[0] == "2.27.7-1+cuda12.4"
    assert nccl.nccl_builds(OFFERED, "12.8", "2.27.7-1") == ["2.27.7-1+cuda12.4"]


def test_the_highest_minor_not_above_the_toolkit():
    assert nccl.nccl_builds(OFFERED, "12.9", "2.27.7-1")[0] == "2.27.7-1+cuda12.9"
    assert nccl.nccl_builds(OFFERED, "13.0")[0] == "2.27.7-1+cuda13.0"
    assert nccl.nccl_builds(OFFERED, "12.10")[0] == "2.27.7-1+cuda12.9"  # minors compare as numbers


def test_never_another_major():
    assert "2.27.7-1+cuda13.0" not in nccl.nccl_builds(OFFERED, "12.9")
    assert nccl.nccl_builds(OFFERED, "11.8") == []


def test_release_prefix():
    assert nccl.nccl_builds(OFFERED, "12.8", "2.26") == ["2.26.2-1+cuda12.8"]
    assert nccl.nccl_builds(OFFERED, "12.9", "2.27") == [
        "2.27.7-1+cuda12.9",
        "2.27.7-1+cuda12.4",
        "2.27.3-1+cuda12.9",
        "2.27.3-1+cuda12.4",
    ]
    assert nccl.nccl_builds(OFFERED, "12.8", "2.2") == []  # 2.2 is not 2.27


def test_a_full_version_is_taken_as_it_is_when_offered():
    assert nccl.nccl_builds(OFFERED, "12.8", "2.27.3-1+cuda12.9") == ["2.27.3-1+cuda12.9"]
    assert nccl.nccl_builds(OFFERED, "12.8", "2.27.3-1+cuda12.8") == []


def test_no_fit_lists_every_build():
    assert nccl.nccl_builds(OFFERED, "12.3", "2.27") == []
    assert nccl.cuda_builds(OFFERED)[0] == "2.25.1-1+cuda12.8" and "2.18.5-1-2" not in nccl.cuda_builds(OFFERED)
