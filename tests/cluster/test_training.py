"""What users do next on the 3-node test cluster, checked by `clustercheck run` as users run it: a Lightning job across
every node (with Lightning installed in the nodes' environment from the wheelhouse), the DDP stage's checkpoint
round trip, and the same data on every node; each with a fault made for real on one node.

The data test runs first, while Lightning is not installed yet (so the lightning stage is SKIP there); the
module's Lightning is removed again at the end, so the other cluster tests see the environment they expect.
"""

from __future__ import annotations

import shlex

import pytest
import torchenv
from harness import checks_of, clustercheck, ssh_client, ssh_run, torch_fault_on_node

pytestmark = pytest.mark.cluster
DATASET = "/srv/clustercheck-test-dataset"


def on_every_node(cluster, command: str) -> None:
    for node in cluster.nodes:
        with ssh_client(cluster, node) as client:
            status, out = ssh_run(client, command, timeout=60)
            assert status == 0, f"{node.name}: {out[-500:]}"


def test_a_differing_data_path_and_a_directory_that_is_not_shared_are_named(torch_cluster, tmp_path):
    """The same 40 files on every node, then one file on node3 one byte longer; /srv/clustercheck-test-shared is a
    local directory on every node (no shared mount), so node2 and node3 never see node1's token."""
    make = (
        f"rm -rf {DATASET} /srv/clustercheck-test-shared && mkdir -p {DATASET}/train /srv/clustercheck-test-shared && "
        f"for i in $(seq 1 40); do printf 'sample %s\\n' $i > {DATASET}/train/$i.txt; done"
    )
    on_every_node(torch_cluster, make)
    with ssh_client(torch_cluster, torch_cluster.node("node3")) as client:
        ssh_run(client, f"printf 'x' >> {DATASET}/train/17.txt")
    try:
        proc = clustercheck(
            torch_cluster,
            tmp_path,
            "--skip",
            "network",
            "--skip",
            "collectives",
            "--skip",
            "ddp",
            "--skip",
            "local.*",
            "--skip",
            "lightning",  # its SKIP without Lightning installed: test_run.py's run of every check
            "--data-path",
            DATASET,
            "--shared-dir",
            "/srv/clustercheck-test-shared",
            "--format",
            "json",
            timeout=300,
        )
    finally:
        on_every_node(torch_cluster, f"rm -rf {DATASET} /srv/clustercheck-test-shared")
    assert proc.returncode == 1, proc.stderr[-2000:]
    checks = checks_of(proc)
    paths = checks[("data.paths", None)]
    assert paths["status"] == "FAIL", paths["message"]
    assert f"{DATASET} differs on node3: total size" in paths["message"]
    assert "sample hash" in paths["message"] and "node1" not in paths["message"]
    assert paths["data"]["paths"][DATASET]["files"] == 40
    assert paths["data"]["paths"][DATASET]["differing_nodes"] == ["node3"]
    shared = checks[("data.shared_dir", None)]
    assert shared["status"] == "FAIL", shared["message"]
    assert "node2, node3 do not see the token node1 wrote" in shared["message"]


def test_a_rank_loading_a_perturbed_checkpoint_is_named(torch_cluster, tmp_path):
    """node2's torch.load returns its file with the first number changed by 1e-6 (a module loaded into its torch
    environment at interpreter start): rank 1, and only rank 1, loaded other state than rank 0 saved. (The round
    trip passing on healthy nodes: test_run.py's run of every check.)"""
    args = ("--only", "ddp", "--skip", "local.*", "--nproc-per-node", "1", "--format", "json")
    with torch_fault_on_node(torch_cluster, torch_cluster.node("node2"), "checkpoint"):
        proc = clustercheck(torch_cluster, tmp_path, *args, "--master-port", "29688", timeout=300)
    assert proc.returncode == 1, proc.stderr[-2000:]
    checkpoint = checks_of(proc)[("checkpoint", None)]
    assert checkpoint["status"] == "FAIL", checkpoint["message"]
    assert checkpoint["data"]["ranks_loading_other_state"] == [1]
    assert "rank 1 (node2) loaded state different from what rank 0 saved" in checkpoint["message"]
    assert checks_of(proc)[("ddp_equivalence", None)]["status"] == "PASS"


@pytest.fixture(scope="module")
def lightning_cluster(torch_cluster, lightning_wheelhouse):
    """The torch cluster with Lightning in the nodes' torch environment, for this module's tests only."""
    errors = torchenv.install_packages(torch_cluster, lightning_wheelhouse, [torchenv.LIGHTNING_PIN])
    if errors:
        pytest.fail("installing Lightning on the nodes failed: " + "; ".join(errors))
    yield torch_cluster
    torchenv.remove_packages(torch_cluster, ["lightning", "pytorch-lightning"])


def test_lightning_over_three_nodes_with_six_ranks_matches_a_single_process_run(lightning_cluster, tmp_path):
    proc = clustercheck(
        lightning_cluster, tmp_path, "--only", "lightning", "--skip", "local.*", "--format", "json", timeout=400
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    checks = checks_of(proc)
    result = checks[("lightning.ddp", None)]
    assert result["status"] == "PASS", result["message"]
    assert result["data"]["world_size"] == 6 and result["data"]["num_nodes"] == 3
    assert result["data"]["dtype"] == "float64" and result["data"]["max_abs_param_diff"] < 1e-12
    seen = result["data"]["seen"]
    assert sorted(v["node_rank"] for v in seen.values()) == [0, 0, 1, 1, 2, 2]
    assert {v["cluster_environment"] for v in seen.values()} == {"TorchElasticEnvironment"}
    assert checks[("lightning.import", "node3")]["status"] == "PASS"
    assert "lightning 2.6.6" in checks[("lightning.import", "node3")]["message"]


def test_a_node_whose_lightning_training_diverges_is_named(lightning_cluster, tmp_path):
    with torch_fault_on_node(lightning_cluster, lightning_cluster.node("node3"), "lr"):
        proc = clustercheck(
            lightning_cluster,
            tmp_path,
            *("--only", "lightning", "--skip", "local.*", "--nproc-per-node", "1", "--master-port", "29689"),
            "--format",
            "json",
            timeout=400,
        )
    assert proc.returncode == 1, proc.stderr[-2000:]
    result = checks_of(proc)[("lightning.ddp", None)]
    assert result["status"] == "FAIL", result["message"]
    assert "rank 2 (node3)" in result["message"]
    assert result["data"]["disagreeing_ranks"] == [2] and result["data"]["world_size"] == 3


def test_only_lightning_fails_where_lightning_does_not_import(lightning_cluster, tmp_path):
    """Lightning taken out of node2's environment (the module's teardown removes it everywhere anyway)."""
    with ssh_client(lightning_cluster, lightning_cluster.node("node2")) as client:
        status, out = ssh_run(
            client, f"{shlex.quote(torchenv.PYTHON)} -m pip uninstall -q -y lightning pytorch-lightning"
        )
        assert status == 0, out
    proc = clustercheck(
        lightning_cluster, tmp_path, "--only", "lightning", "--skip", "local.*", "--format", "json", timeout=300
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    checks = checks_of(proc)
    assert checks[("lightning.import", "node2")]["status"] == "FAIL"
    assert "No module named" in checks[("lightning.import", "node2")]["message"]
    assert checks[("lightning.import", "node1")]["status"] == "PASS"
    assert checks[("lightning.ddp", None)]["status"] == "FAIL"
