"""From a finding to the setup line that puts it right (checks/setup_roles.py), on facts recorded on a test node
with a 64 MiB /dev/shm and chrony stopped (records/README.md)."""

from __future__ import annotations

import json

import jsonschema
from test_checks import recorded_node

from clustercheck import report
from clustercheck.checks import registry, setup_roles
from clustercheck.checks.consistency import compare
from clustercheck.model import Status
from clustercheck.report import Report
from clustercheck.report import json as json_report


def test_a_node_finding_gains_the_command_of_the_role_that_sets_it():
    results = registry.run_node_checks(recorded_node("facts-node3-shm-tmp-chrony.json"))
    fixed = {r.name: r for r in setup_roles.with_fix_commands(results, "inventory/hosts.ini")}
    command = "ansible-playbook site.yml -i inventory/hosts.ini --limit node3 --tags base"
    for name in ("shm.size", "time.sync"):
        assert fixed[name].status is Status.FAIL
        assert fixed[name].fix_command == command  # contract: the command a user runs
        assert fixed[name].remediation.endswith(f"Or rerun the role that sets it: {command}")
    assert all(r.fix_command is None for r in fixed.values() if r.status in (Status.PASS, Status.SKIP))
    document = json_report.document(Report(list(fixed.values()), ["node3"]))
    jsonschema.Draft202012Validator(json.loads(report.schema_text())).validate(document)
    shm = next(c for c in document["checks"] if c["name"] == "shm.size")
    assert shm["fix_command"] == command  # contract: as above, in the JSON report
    assert "fix_command" not in next(c for c in document["checks"] if c["name"] == "os.info")


def test_a_cross_node_finding_names_the_nodes_that_differ_and_a_host_list_gets_no_command():
    finding = compare({"node1": "2.13.0", "node2": "2.13.0", "node3": "2.12.1", "node4": "2.12.0"}, "torch version")
    result = registry.get("consistency.torch").result(None, finding)
    (fixed,) = setup_roles.with_fix_commands([result], "/srv/my inventory")
    command = "ansible-playbook site.yml -i '/srv/my inventory' --limit node3,node4 --tags python_env"
    assert fixed.fix_command == command  # contract: the command a user (or a script) runs
    assert setup_roles.with_fix_commands([result], None) == [result]  # --hosts node1,node2 or localhost


def test_the_run_doc_lists_the_mapping():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "run.md").read_text()
    table = text.split("| role (tag) | checks |", 1)[1].split("\n\n", 1)[0]
    listed = {}
    for row in table.strip().splitlines()[1:]:
        role, names = (cell.strip() for cell in row.strip("|").split("|"))
        listed.update({name.strip("` "): role.strip("`") for name in names.split(",")})
    assert listed == setup_roles.ROLE_OF


def test_a_connection_refused_names_the_firewall_of_the_node_connected_to():
    """The probe's records of the test cluster with node3 dropping new connections from the other nodes."""
    from test_network import evaluate, load

    results = evaluate(load("netprobe-node3-firewall.json"), cidr="172.30.82.0/24")
    fixed = [r for r in setup_roles.with_fix_commands(results, "hosts.ini") if r.name == "network.tcp"]
    failed = [r for r in fixed if r.status is Status.FAIL]
    assert [(r.host, r.data["to"]) for r in failed] == [("node1", "node3"), ("node2", "node3")]
    assert {r.fix_command for r in failed} == {"ansible-playbook site.yml -i hosts.ini --limit node3 --tags firewall"}
