"""What the options asked for, against what was done: an option that asks for work of its own (--burn, --dcgm-level)
and found nowhere to do it says so in one line, instead of a run whose every check of that work SKIPs and whose
verdict reads as if it had been done. The verdict (report/__init__.py) is then NOT VERIFIED as asked, naming it.
"""

from __future__ import annotations

from typing import Any

from clustercheck.checks import gpuburn
from clustercheck.checks.registry import Finding, cluster_check, passed, skip, warn
from clustercheck.facts.model import NodeFacts

NAME = "options.done"


def undone(nodes: list[NodeFacts], config: Any) -> tuple[list[str], list[str]]:
    """(what the options asked for that was done on no node, what was done and where), one line each."""
    no_gpu = all(n.smi is None for n in nodes)
    seconds = getattr(config, "burn_seconds", None)
    level = getattr(config, "dcgm_level", None)
    asked = []  # (the option as given, the nodes it was done on, "done" words, why not without a GPU, why else)
    if seconds and gpuburn.wanted(config.selection):
        burned = [n.host for n in nodes if n.gpu_burn is not None]
        asked.append((f"--burn {seconds:g}s", burned, "burned on", "the burn ran on no node (gpu.burn.* says why)",
                      "nothing was burned"))  # fmt: skip
    if level:
        ran = [n.host for n in nodes if n.dcgm is not None]
        asked.append((f"--dcgm-level {level}", ran, "run on", "dcgmi (DCGM) is installed on no node with a GPU",
                      "no DCGM diagnostic ran"))  # fmt: skip
    missing: list[str] = []
    done: list[str] = []
    for option, where, did, why_else, nothing in asked:
        if where:
            done.append(f"{option}: {did} {', '.join(where)}")
        else:
            missing.append(f"{option}: {'no GPU on any node' if no_gpu else why_else}, {nothing}")
    return missing, done


@cluster_check(
    NAME,
    proves="the work an option asked for (--burn, --dcgm-level) was done on at least one node",
    fix="Run it where the work can happen (nodes with NVIDIA GPUs, DCGM installed for --dcgm-level), or leave the "
    "option out: a verdict never reads as if work was done that could not be.",
)
def options_done(nodes: list[NodeFacts], config: Any) -> Finding:
    if not nodes:
        return skip("no node's facts were collected")
    missing, done = undone(nodes, config)
    if missing:
        return warn("; ".join(missing), undone=missing, done=done)
    if not done:
        return skip("no option asked for work of its own (--burn, --dcgm-level)")
    return passed("; ".join(done), done=done)
