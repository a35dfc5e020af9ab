"""A probe that never answers (a read that never returns, a process stuck in the kernel that no signal ends): the
collector gives it up at its deadline and names it (remote/probing.run_all), the checks that read what it was to
bring FAIL under their own names (checks/registry.py), and node-health fits each probe's deadline in its budget
(run/health.probe_shares)."""

from __future__ import annotations

import threading
import time

from test_checks import by_name, node_facts
from wording import says

from clustercheck.facts.model import HUNG
from clustercheck.model import Status
from clustercheck.remote import probing
from clustercheck.run import health
from clustercheck.slurm import drain


def test_a_probe_that_never_answers_is_given_up_at_the_deadline_and_named_and_the_others_answer():
    stuck = threading.Event()  # never set: the probe waits as a read of a hung mount does
    probes = {
        "launch_files": lambda timeout: stuck.wait(),
        "nvswitches": lambda timeout: 0,  # an answer that is falsy is an answer
        "neigh_thresholds": lambda timeout: {},
        "echo": ["sh", "-c", "echo fine"],
    }
    started = time.monotonic()
    answers = probing.run_all(probes, timeout=0.5)()
    took = time.monotonic() - started
    assert took < 0.5 + probing.HUNG_SLACK + 1, took
    assert answers["launch_files"] == {"error": f"{HUNG}launch_files gave no answer within 0.5 s"}
    assert answers["nvswitches"] == 0 and answers["neigh_thresholds"] == {}
    assert answers["echo"]["rc"] == 0 and answers["echo"]["out"] == "fine\n"


def test_a_check_whose_facts_hung_fails_under_its_own_name_with_what_hung():
    facts = node_facts(launch_files={"error": f"{HUNG}launch_files gave no answer within 7 s"}, netdevs={})
    result = by_name(facts)["env.launch"]
    assert result.status is Status.FAIL
    assert says(result.message, "node1: ", "hung", "launch_files", "within 7 s")
    assert "D" in result.remediation  # where to look: processes in uninterruptible sleep
    drain_reason = drain.drain_reason(result)
    assert drain_reason.startswith("clustercheck: env.launch: ") and says(drain_reason, "hung", "launch_files", "7 s")
    # A fact the probe could not collect for another cause is what it was: the check's own "unknown" status.
    missing = by_name(node_facts(launch_files={"error": "PermissionError: /etc/nccl.conf"}))["env.launch"]
    assert missing.status is not Status.FAIL and "could not collect" in missing.message


def test_a_hung_chronyc_is_a_time_service_that_does_not_answer():
    hung = {"error": f"{HUNG}chronyc -n tracking gave no answer within 7 s"}
    result = by_name(node_facts(commands={"chronyc": hung}))["time.sync"]
    assert result.status is Status.FAIL and "hung: chronyc -n tracking gave no answer" in result.message


def test_node_health_gives_each_probe_a_share_that_fits_in_what_is_left_of_its_budget():
    # The default budget: the collector's 25 s leave the probes their 10 s and torch its 20 s.
    assert health.probe_shares(health.COLLECTOR_DEADLINE) == (health.PROBE_DEADLINE, health.TORCH_DEADLINE)
    # A Prolog's 10 s: every probe, and torch's import, gives up in time for the collector to answer.
    probes, torch = health.probe_shares(health.Budget(10).give(health.COLLECTOR_DEADLINE))
    assert probes + probing.HUNG_SLACK < 10 - 1 and torch == probes
    assert health.probe_shares(2.0) == (1.0, 1.0)  # never less than a second
