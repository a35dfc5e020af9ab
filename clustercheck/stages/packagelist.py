"""The node's full package lists kept in the run directory (what consistency.packages compares)."""

from __future__ import annotations

from clustercheck.facts.model import NodeFacts


def write_packages(facts: NodeFacts, host_dir) -> None:
    """The node's full package lists into the run directory (what consistency.packages compares), in
    `pip freeze` and `conda list --export` form."""
    if facts.packages is None:
        return
    lines = [f"# {facts.host}: {facts.environment} ({facts.packages.prefix})", "# pip"]
    lines += [f"{name}=={version}" for name, version in sorted(facts.packages.pip.items())]
    if facts.packages.conda is not None:
        lines += ["# conda"] + [f"{name}={version}" for name, version in sorted(facts.packages.conda.items())]
    (host_dir / "packages.txt").write_text("\n".join(lines) + "\n")
