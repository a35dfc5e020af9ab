"""Expected values per GPU model (clustercheck/expected/): the shipped files are valid and every figure carries its
source, recorded nvidia-smi outputs pick the right model, a user's file adds or overrides models, a bad file is one
line and exit code 4, and the checks judge against the model's figures (or say that they fall back)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from harness import run_cli
from test_checks import H800, by_name, node_facts
from wording import says

from clustercheck import expected
from clustercheck.checks import collectives
from clustercheck.exitcodes import ExitCode
from clustercheck.facts import parse
from clustercheck.inventory import Node
from clustercheck.model import CheckResult, Status
from clustercheck.run import health

DATA = Path(__file__).parent / "data"
A100 = (DATA / "nvidia-smi-q-a100-sxm4-80gb-cudalibrarysamples-104.txt").read_text()
L40S = (DATA / "nvidia-smi-q-l40s-isaacsim-228.txt").read_text()
H100_NAME = next(iter(parse.parse_nvlink_errors((DATA / "nvlink-e-h100-ml-engineering.txt").read_text()).values()))[
    "name"
]


def test_every_shipped_figure_names_its_public_source_and_quotes_it():
    files = expected.shipped_files()
    assert {p.name for p in files} >= {
        "h100-sxm.yml",
        "h100-pcie.yml",
        "a100-sxm4-80gb.yml",
        "l40s.yml",
        "h200-sxm.yml",
    }
    for path in files:
        assert expected.load(path)  # fits the schema (the shipped files are not validated at each start)
        for model in yaml.safe_load(path.read_text())["models"]:
            sourced = {"nvidia_smi_names": model["nvidia_smi_names"], **model.get("figures", {})}
            for name, figure in sourced.items():
                where = f"{path.name}: {model['model']}: {name}"
                assert isinstance(figure, dict), f"{where}: a bare value, without its source"
                assert str(figure.get("source", "")).startswith("https://"), f"{where}: no source address"
                assert figure.get("quote", "").strip(), f"{where}: no quote from the source"


def test_the_shipped_models_load_and_every_gpu_name_belongs_to_one_model():
    catalog = expected.shipped()
    names = [n for m in catalog.models.values() for n in m.nvidia_smi_names]
    assert len(names) == len(set(names))
    h100 = catalog.models["h100 sxm"]
    assert h100.get("nvlink_links") == 18 and h100.get("pcie_gen") == 5 and h100.get("gpus_per_node") == [8]
    assert catalog.models["l40s"].get("nvlink_links") == 0


@pytest.mark.parametrize(
    ("smi", "model"),
    [(A100, "A100 SXM 80GB"), (L40S, "L40S"), (H800.replace("NVIDIA H800", H100_NAME), "H100 SXM")],
    ids=["a100-sxm4-80gb", "l40s", "h100-sxm"],
)
def test_a_recorded_nvidia_smi_output_picks_its_model(smi, model):
    facts = node_facts(smi=smi)
    assert facts.expected.model is not None and facts.expected.model.name == model
    assert model in by_name(facts)["gpu.count"].message


def test_a_model_without_a_file_falls_back_and_says_so():
    results = by_name(node_facts(gpus_expected=1, smi=H800))
    assert node_facts(smi=H800).expected.model is None
    assert results["gpu.count"].status is Status.PASS
    assert results["pcie.link"].status is Status.PASS
    assert "no expected values for NVIDIA H800" in results["pcie.link"].message
    count = by_name(node_facts(smi=H800))["gpu.count"]  # no gpus_per_node either
    assert count.status is Status.PASS and "compared with the other nodes' only" in count.message
    assert "compared with each GPU's own maximum only" in results["pcie.link"].message
    memory = results["gpu.memory"]
    assert memory.status is Status.SKIP and "no expected values for NVIDIA H800" in memory.message


def test_a_model_file_judges_count_memory_and_pcie():
    h100 = H800.replace("NVIDIA H800", H100_NAME)
    results = by_name(node_facts(smi=h100))
    # One GPU where an HGX H100 board carries eight: named, the inventory's gpus_per_node has the last word.
    assert results["gpu.count"].status is Status.WARN and "H100 SXM boards carry 8" in results["gpu.count"].message
    assert by_name(node_facts(smi=h100, gpus_expected=1))["gpu.count"].status is Status.PASS
    assert results["gpu.memory"].status is Status.PASS and "81559 MiB" in results["gpu.memory"].message
    assert results["pcie.link"].status is Status.PASS and "H100 SXM" in results["pcie.link"].message
    # The same GPU in a PCIe gen 4 host (the Max lines edited): the host gives less than the model.
    gen4 = h100.replace("Max                       : 5", "Max                       : 4")
    link = by_name(node_facts(smi=gen4))["pcie.link"]
    assert link.status is Status.WARN and "gen 4 at most, where H100 SXM runs gen 5" in link.message
    # Less memory than the datasheet (the Total line edited, as a 40 GB part would show).
    small = h100.replace(": 81559 MiB", ": 40536 MiB")
    memory = by_name(node_facts(smi=small))["gpu.memory"]
    assert memory.status is Status.WARN and "40536 MiB" in memory.message


def test_nvlink_links_against_the_model():
    h100 = H800.replace("NVIDIA H800", H100_NAME)
    status = (DATA / "nvlink-s-v100-azhpc-diagnostics-73.txt").read_text()
    # The V100's six-link listing reported for an H100 SXM (the GPU line's name edited): 6 links of 18.
    lines = status.splitlines()
    lines[0] = lines[0].replace("Tesla V100-SXM2-32GB", H100_NAME)
    result = by_name(node_facts(smi=h100, commands={"nvlink": {"rc": 0, "out": "\n".join(lines) + "\n"}}))["gpu.nvlink"]
    assert result.status is Status.WARN
    assert "where H100 SXM has 18" in result.message and "inactive" in result.message
    # A user's file that gives 18 links of at least 26 GB/s for that model: the V100's 25.781 GB/s links are slow.
    own = expected.Catalog(expected.shipped().models.values())
    own.add(expected.Model("H100 SXM", (), {"nvlink_link_gbps": expected.Figure(26)}, ("own.yml",)))
    facts = node_facts(smi=h100, commands={"nvlink": {"rc": 0, "out": "\n".join(lines) + "\n"}})
    facts = replace(facts, models=own)
    slow = by_name(facts)["gpu.nvlink"]
    assert slow.status is Status.WARN and "link(s) 0 at 25.781 GB/s, 1 at 25.781 GB/s" in slow.message
    assert "below 26 GB/s" in slow.message


def test_a_users_file_overrides_figures_and_adds_models(tmp_path):
    own = tmp_path / "expected.yml"
    own.write_text(
        "schema_version: 1\n"
        "models:\n"
        "  - model: H100 SXM\n"
        "    figures:\n"
        "      gpus_per_node: [1, 2, 4, 8]\n"  # cloud VMs with part of an HGX board
        "  - model: H800\n"
        "    nvidia_smi_names: [NVIDIA H800]\n"
        "    figures:\n"
        "      gpus_per_node: {value: [8], source: our purchase order}\n"
        "      pcie_gen: 5\n"
    )
    catalog = expected.shipped().with_file(own)
    h100 = catalog.models["h100 sxm"]
    assert h100.get("gpus_per_node") == [1, 2, 4, 8] and h100.get("nvlink_links") == 18  # the rest is kept
    assert h100.files == ("clustercheck/expected/h100-sxm.yml", str(own))
    facts = node_facts(smi=H800)
    facts = replace(facts, models=catalog)
    count = by_name(facts)["gpu.count"]
    assert count.status is Status.WARN and "H800 boards carry 8" in count.message and str(own) in count.message
    assert expected.shipped().models.get("h800") is None  # the shipped catalog is untouched


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (
            "schema_version: 1\nmodels:\n  - model: H100 SXM\n    figures:\n      pcie_gen: five\n",
            "models[0].figures.pcie_gen: 'five' is not a valid value",
        ),
        (
            "schema_version: 1\nmodels:\n  - model: H100 SXM\n    figures:\n      pcie_lanes: 16\n",
            "models[0].figures: unknown field(s) ('pcie_lanes' was unexpected)",
        ),
        ("schema_version: 1\nmodels:\n  - model: B300\n", "'B300' is not a shipped model; give its nvidia_smi_names"),
        ("models: [\n", "not YAML at line"),
    ],
    ids=["wrong-type", "unknown-figure", "new-model-without-names", "not-yaml"],
)
def test_a_bad_file_is_one_line_and_exit_code_4(tmp_path, text, says):
    bad = tmp_path / "expected.yml"
    bad.write_text(text)
    with pytest.raises(expected.ExpectedError) as raised:
        expected.shipped().with_file(bad)
    assert says in str(raised.value) and "\n" not in str(raised.value)
    proc = run_cli("run", "--hosts", "localhost", "--expected", str(bad), "--run-dir", str(tmp_path / "run"))
    assert proc.returncode == ExitCode.USAGE_ERROR
    assert proc.stderr.startswith("clustercheck: error: expected values: ") and str(raised.value) in proc.stderr
    assert not (tmp_path / "run").exists()  # refused before anything ran


def test_a_missing_file_is_a_usage_error(tmp_path):
    proc = run_cli("run", "--hosts", "localhost", "--expected", str(tmp_path / "none.yml"))
    assert proc.returncode == ExitCode.USAGE_ERROR
    assert proc.stderr.startswith(f"clustercheck: error: expected values: {tmp_path / 'none.yml'}: cannot read it")


def test_intra_node_busbw_threshold_from_the_model_unless_min_busbw_is_given():
    facts = node_facts(smi=H800.replace("NVIDIA H800", H100_NAME))
    one = collectives.intra_node_thresholds(facts, collectives.Thresholds())
    assert not one.given  # the recording has one GPU: Azure's figure is for a node of 8
    facts.smi.gpus *= 8  # the one recorded GPU as eight
    model = collectives.intra_node_thresholds(facts, collectives.Thresholds())
    assert model.warn_below == 460 and "H100 SXM" in model.describe()
    given = collectives.parse_min_busbw("40:80")
    assert collectives.intra_node_thresholds(facts, given) is given


def test_the_checks_doc_names_every_shipped_file():
    text = (Path(__file__).parents[2] / "docs" / "checks.md").read_text()
    section = text.split("\n## Expected values per GPU model\n")[1]
    for path in expected.shipped_files():
        assert f"`{path.name}`" in section.split("\n## ")[0], path.name


def test_the_inventory_names_the_users_file(tmp_path):
    bad = tmp_path / "site-expected.yml"
    bad.write_text("schema_version: 2\nmodels: []\n")
    inv = tmp_path / "hosts.ini"
    inv.write_text(f"[gpu]\nlocalhost ansible_connection=local clustercheck_expected_file={bad}\n")
    proc = run_cli("run", "--hosts", str(inv), "--run-dir", str(tmp_path / "run"))
    assert proc.returncode == ExitCode.USAGE_ERROR
    assert proc.stderr.startswith("clustercheck: error: expected values: ")
    assert says(proc.stderr, str(bad), "schema_version", "1 was expected")
    # --expected wins over the inventory's file: the run goes ahead (the core stage alone, on this machine).
    good = tmp_path / "own.yml"
    good.write_text("schema_version: 1\nmodels:\n  - model: L40S\n    figures:\n      pcie_gen: 5\n")
    args = ["--expected", str(good), "--only", "core", "--skip", "local.*", "--format", "json"]
    proc = run_cli("run", "--hosts", str(inv), *args, "--run-dir", str(tmp_path / "run"))
    assert proc.returncode != ExitCode.USAGE_ERROR and "expected values" not in proc.stderr, proc.stderr
    assert any(c["name"] == "gpu.memory" for c in json.loads(proc.stdout)["checks"])


def test_the_intra_node_threshold_judges_only_that_nodes_sweep():
    """A real 2x2 gloo run's records (tests/unit/records): the model's threshold WARNs on the intra-node sweeps, the
    cluster-wide sweep keeps --min-busbw (none here)."""
    records = json.loads((Path(__file__).parent / "records" / "collectives-2x2.json").read_text())
    node = records[0]["host"]
    facts = node_facts(smi=H800.replace("NVIDIA H800", H100_NAME))
    facts.smi.gpus *= 8
    model = collectives.intra_node_thresholds(facts, collectives.Thresholds())
    results = collectives.evaluate_bandwidth(records, 4, collectives.Thresholds(), [node], {node: model})
    cluster, *intra = results
    assert cluster.status is Status.PASS and not cluster.data["thresholds"]["warn_below"]
    assert intra and all(r.status is Status.WARN for r in intra)
    assert "under the threshold (WARN below 460 GB/s, expected values of H100 SXM in" in intra[0].message


def test_node_health_takes_the_users_file(tmp_path):
    """node-health (Slurm's health program, no inventory) judges with --expected FILE: node3's recorded facts with
    the H800 output under an H100's name as its nvidia-smi (values edited), against a file that says 141 GB."""
    raw = json.loads((Path(__file__).parent / "records" / "facts-node3-shm-tmp-chrony.json").read_text())
    raw["gpu_bridges"]["gpus"] = {"0000:18:00.0": ["0000:15:01.0"]}
    raw["commands"]["nvidia_smi_q"] = {"rc": 0, "out": H800.replace("NVIDIA H800", H100_NAME)}
    own = tmp_path / "own.yml"
    own.write_text("schema_version: 1\nmodels:\n  - model: H100 SXM\n    figures:\n      memory_gb: 141\n")
    node = Node(name="node3", address="localhost")

    def memory(**models) -> CheckResult:
        return {r.name: r for r in health.judge(node, raw, python="p", source="s", **models)}["gpu.memory"]

    assert memory().status is Status.PASS
    judged = memory(models=expected.shipped().with_file(own))
    assert judged.status is Status.WARN and "the 141 GB of H100 SXM" in judged.message and str(own) in judged.message
    bad = tmp_path / "bad.yml"
    bad.write_text("schema_version: 1\nmodels: {}\n")
    proc = run_cli("node-health", "--expected", str(bad))
    assert proc.returncode == ExitCode.USAGE_ERROR
    assert proc.stderr.startswith("clustercheck: error: expected values: ")
    assert says(proc.stderr, str(bad), "models", "is not of type 'array'")


def test_the_checks_doc_table_of_figures_is_the_schemas():
    text = (Path(__file__).parents[2] / "docs" / "checks.md").read_text()
    listed = text.split("<!-- BEGIN figures", 1)[1].split("-->\n", 1)[1].split("<!-- END figures -->")[0]
    assert listed == expected.figure_table(), "regenerate: scripts/checks_docs.py"
