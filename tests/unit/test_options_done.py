"""options.done words each option that asked for work of its own (--burn, --dcgm-level) one way: where it was done,
or why it was done nowhere (no GPU on any node, else the option's own cause)."""

from __future__ import annotations

from types import SimpleNamespace

from wording import says

from clustercheck.checks import requests
from clustercheck.selection import Selection


def node(host: str, gpu: bool = True, burned: bool = False, dcgm: bool = False) -> SimpleNamespace:
    return SimpleNamespace(host=host, smi=object() if gpu else None, gpu_burn=object() if burned else None,
                           dcgm=object() if dcgm else None)  # fmt: skip


def test_each_option_says_where_it_was_done_or_why_not():
    config = SimpleNamespace(burn_seconds=30.0, dcgm_level=2, selection=Selection())
    missing, done = requests.undone([node("n1", burned=True), node("n2", burned=True)], config)
    assert len(done) == 1 and says(done[0], "--burn 30s", "burned on n1, n2")
    assert len(missing) == 1 and says(missing[0], "--dcgm-level 2", "dcgmi (DCGM) is installed on no node with a GPU")
    missing, done = requests.undone([node("n1", dcgm=True)], config)
    assert len(done) == 1 and says(done[0], "--dcgm-level 2", "run on n1")
    assert len(missing) == 1 and says(missing[0], "--burn 30s", "ran on no node", "gpu.burn.* says why")
    missing, _ = requests.undone([node("n1", gpu=False)], config)
    burn, dcgm = missing
    assert says(burn, "--burn 30s", "no GPU on any node") and says(dcgm, "--dcgm-level 2", "no GPU on any node")
