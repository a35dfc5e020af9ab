"""PCIe between the GPUs and the host: the link each GPU trained at, and the IOMMU mode the kernel was booted
with (DMA remapping slows or breaks GPU peer-to-peer and GPUDirect RDMA)."""

from __future__ import annotations

from clustercheck.checks.registry import Finding, node_check, passed, skip, warn
from clustercheck.facts import parse
from clustercheck.facts.model import NodeFacts


@node_check(
    "pcie.link",
    proves="every GPU's PCIe link runs at its full width (lanes), and the host gives it the generation and width "
    "its model's expected values say; the generation in use is shown, since GPUs lower it when idle",
    fix="A link below its width is a badly seated GPU or riser, or a bad slot: reseat it, check the BIOS PCIe "
    "settings, and compare with `lspci -vv` (LnkSta against LnkCap) under load. A host that gives a lower "
    "generation than the GPU's is an older platform or a BIOS setting: check the slot's generation in the BIOS.",
    needs_gpu=True,
)
def pcie_link(facts: NodeFacts) -> Finding:
    assert facts.smi is not None
    match = facts.expected
    model = match.model
    gen, width = (model.get("pcie_gen"), model.get("pcie_width")) if model else (None, None)
    links = {
        g.bus_id: {"gen": g.pcie_gen, "gen_max": g.pcie_gen_max, "width": g.pcie_width, "width_max": g.pcie_width_max}
        for g in facts.smi.gpus
    }
    data = {"links": links, "expected": {"gen": gen, "width": width}}
    narrow = [
        f"{bus}: x{link['width']} of x{link['width_max']}"
        for bus, link in links.items()
        if link["width"] is not None and link["width_max"] is not None and link["width"] < link["width_max"]
    ]
    if narrow:
        return warn(f"PCIe link narrower than its maximum: {'; '.join(narrow)}", **data)
    below = []
    if width:
        below += [
            f"{bus}: x{link['width_max']} at most, where {model.name} has x{width}"
            for bus, link in links.items()
            if link["width_max"] is not None and link["width_max"] < width
        ]
    if gen:
        below += [
            f"{bus}: gen {link['gen_max']} at most, where {model.name} runs gen {gen}"
            for bus, link in links.items()
            if link["gen_max"] is not None and link["gen_max"] < gen
        ]
    if below:
        return warn(f"the host gives the GPUs less than their model: {'; '.join(below)} ({match.why})", **data)
    slower = [
        f"{bus} gen {link['gen']} of {link['gen_max']}"
        for bus, link in links.items()
        if link["gen"] is not None and link["gen_max"] is not None and link["gen"] < link["gen_max"]
    ]
    known = [link for link in links.values() if link["width"] is not None]
    judged = match.why if model else match.fallback("compared with each GPU's own maximum only")
    if not known:
        return passed(f"PCIe link not reported by nvidia-smi ({judged})", **data)
    note = f" ({', '.join(slower)}: GPUs lower the generation when idle)" if slower else ""
    widths = sorted({f"x{link['width']}" for link in known})
    return passed(f"every GPU's PCIe link at full width ({', '.join(widths)}){note}; {judged}", **data)


TRANSLATED = ("DMA", "DMA-FQ")  # IOMMU domain types that remap every DMA (the kernel's sysfs-kernel-iommu_groups ABI)


@node_check(
    "pcie.iommu",
    proves="the IOMMU does not translate the GPUs' DMA (their IOMMU group is an identity domain, iommu=pt, or the "
    "IOMMU is off), which NCCL needs for peer-to-peer and GPUDirect RDMA at full speed",
    fix="NCCL's troubleshooting guide: boot with iommu=pt (intel_iommu=on iommu=pt, or amd_iommu=on iommu=pt) in "
    "GRUB_CMDLINE_LINUX, run update-grub and reboot; or disable the IOMMU in the BIOS.",
    reads=("cmdline",),
    needs_gpu=True,
)
def pcie_iommu(facts: NodeFacts) -> Finding:
    assert facts.cmdline is not None
    mode = parse.iommu_mode(facts.cmdline)
    domains = facts.gpu_iommu
    data = {"cmdline_mode": mode, "gpu_domains": domains}
    translated = sorted(gpu for gpu, kind in domains.items() if kind in TRANSLATED)
    if translated:
        return warn(
            f"the IOMMU translates the DMA of {len(translated)} GPU(s) ({', '.join(translated)}: "
            f"{domains[translated[0]]} domain; kernel command line: {mode}): GPU peer-to-peer and GPUDirect RDMA "
            "are slow or hang",
            **data,
        )
    if domains:
        return passed(f"GPUs in {', '.join(sorted(set(domains.values())))} IOMMU domain(s) (no translation)", **data)
    if mode == "translated":
        return warn(
            "the kernel command line turns the IOMMU on without iommu=pt: GPU peer-to-peer and GPUDirect RDMA are "
            "slow or hang",
            **data,
        )
    return passed(f"IOMMU off for the GPUs (kernel command line: {mode})", **data)


REDIRECTS = ("ReqRedir", "CmpltRedir")  # what sends peer-to-peer requests and completions up to the root complex


@node_check(
    "pcie.acs",
    proves="on bare metal, ACS does not redirect peer-to-peer traffic on the PCIe bridges above the GPUs (it "
    "forces GPU-to-GPU traffic through the root complex: slow, or hangs with NCCL)",
    fix="NCCL's troubleshooting guide: disable ACS in the BIOS (often 'PCIe ACS' or 'IOMMU/ACS' settings), or at "
    "boot for each bridge: setpci -s <bridge> ECAP_ACS+0x6.w=0000 (as root, again after every reboot).",
    reads=("gpu_bridges",),
    needs_gpu=True,
)
def pcie_acs(facts: NodeFacts) -> Finding:
    assert facts.gpu_bridges is not None
    if facts.virt and facts.virt != "none":
        return skip(f"a virtual machine ({facts.virt}): the hypervisor needs ACS for passthrough")
    if len(facts.gpu_bridges) < 2:
        return skip("fewer than two GPUs: no peer-to-peer traffic between them")
    redirecting = {}
    unknown = {}
    for bridge, state in facts.acs.items():
        if isinstance(state, dict) and any(state.get(flag) for flag in REDIRECTS):
            redirecting[bridge] = sorted(f for f, on in state.items() if on)
        elif isinstance(state, str):
            unknown[bridge] = state
    data = {"bridges": facts.gpu_bridges, "acs": facts.acs}
    if redirecting:
        below = {
            bridge: sorted(g for g, chain in facts.gpu_bridges.items() if bridge in chain) for bridge in redirecting
        }
        detail = "; ".join(
            f"{b} ({'+, '.join(flags)}+) above {', '.join(below[b])}" for b, flags in sorted(redirecting.items())
        )
        return warn(f"ACS redirects peer-to-peer traffic on {len(redirecting)} bridge(s): {detail}", **data)
    if unknown and len(unknown) == len(facts.acs):
        reason = next(iter(unknown.values()))
        return warn(f"ACS state unknown ({reason}): run clustercheck as root to read it", **data)
    bridges = len(facts.acs)
    return passed(f"no ACS redirection on the {bridges} bridge(s) above {len(facts.gpu_bridges)} GPU(s)", **data)
