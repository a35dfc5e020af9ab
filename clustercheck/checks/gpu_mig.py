"""MIG (Multi-Instance GPU) per GPU, from `nvidia-smi -q` (MIG Mode: Current, Pending) and `nvidia-smi -L` (the MIG
devices under each GPU), judged by NVIDIA's MIG User Guide: with MIG on, CUDA gives a process one MIG device (its
slice's SMs and memory), and MIG devices have no GPU-to-GPU peer access (PCIe or NVLink); a mode change waits for a
GPU reset."""

from __future__ import annotations

from clustercheck.checks.registry import Finding, node_check, passed, skip, warn
from clustercheck.facts.model import NodeFacts

MIG_GUIDE = "https://docs.nvidia.com/datacenter/tesla/mig-user-guide/"


@node_check(
    "gpu.mig",
    proves="each GPU's MIG mode (nvidia-smi -q's MIG Mode) is off, as a multi-GPU training node needs (with MIG on, "
    "a CUDA process gets one MIG device, its slice's SMs and memory, and MIG devices have no peer-to-peer access "
    "over PCIe or NVLink: NVIDIA's MIG User Guide); a GPU with MIG on is named with its MIG devices (nvidia-smi -L), "
    "and one whose mode change waits for a GPU reset (Pending unlike Current) too (SKIP where no GPU supports MIG)",
    fix="To train across the node's GPUs, turn MIG off: `nvidia-smi -i <index> -mig 0` as root with no process on "
    "the GPU, then reset the GPU (nvidia-smi -r -i <index>) or reboot; a pending change is applied by that reset. "
    f"Where MIG is meant (inference, shared nodes), this WARN is expected (NVIDIA's MIG User Guide: {MIG_GUIDE}).",
    needs_gpu=True,
)
def gpu_mig(facts: NodeFacts) -> Finding:
    assert facts.smi is not None
    gpus = facts.smi.gpus
    modes = {g.bus_id: {"current": g.mig_mode, "pending": g.mig_pending} for g in gpus}
    data = {
        "mig": modes,
        "devices": {
            g.bus_id: [{"profile": d.profile, "index": d.index, "uuid": d.uuid} for d in g.mig_devices]
            for g in gpus
            if g.mig_devices
        },
    }
    if not any(g.mig_mode in ("Enabled", "Disabled") for g in gpus):
        return skip("MIG not supported by these GPUs (nvidia-smi -q: MIG Mode N/A)", **data)
    on = [g for g in gpus if g.mig]
    pending = [g for g in gpus if g.mig_pending and g.mig_mode and g.mig_pending != g.mig_mode]
    problems = [f"MIG is on for {g.bus_id}: {g.mig_instances}" for g in on]
    problems += [
        f"MIG mode change pending on {g.bus_id} (current {g.mig_mode}, pending {g.mig_pending}): a GPU reset applies it"
        for g in pending
    ]
    if problems:
        effect = (
            "; CUDA gives each process one MIG device, and MIG devices have no peer access over PCIe or NVLink"
            if on
            else ""
        )
        return warn("; ".join(problems) + effect, **data)
    return passed(f"MIG off on every GPU ({len(gpus)})", **data)
