"""The facts collector (the node-side bundle's `facts` program) run for real on this machine."""

from __future__ import annotations

import json
import subprocess
import sys

from clustercheck.stages import remote


def test_every_probe_of_the_collector_answers_on_this_machine(tmp_path):
    bundle = remote.write(tmp_path)
    proc = subprocess.run(
        [sys.executable, bundle, "facts", "60", "--package", "pytest", "--package", "no-such-distribution"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    facts = json.loads(proc.stdout.strip().splitlines()[-1])
    # A probe that raised records only its error. These read what every Linux machine has (this one lacks
    # /proc/modules, so the kernel-module probe may fail soft here).
    plain = ("os", "torch", "shm", "disk_root", "disk_tmp", "memlock", "hostname", "mtu", "packages", "launch_files")
    failed = {k: facts[k] for k in plain if isinstance(facts[k], dict) and set(facts[k]) == {"error"}}
    assert failed == {}, failed
    assert "pytest" in facts["packages"]["pip"]  # the environment's package list (drift between nodes)
    imports = facts["torch"]["packages"]  # the packages the inventory lists, imported beside torch
    assert "version" in imports["pytest"] and "error" not in imports["pytest"]
    assert imports["no-such-distribution"] == {"error": "not installed"}
