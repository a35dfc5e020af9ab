"""python_env: the recorded environment's python imports torch and numpy at the pinned versions, and every package
the inventory lists in python_env_packages."""

import json
import re
import shlex

import pytest
from acceptance_helpers import setting


def _recorded_python(host) -> str:
    record = host.file("/etc/clustercheck/python")
    assert record.exists, "/etc/clustercheck/python is missing (clustercheck reads the environment's python from it)"
    python = record.content_string.strip()
    assert host.file(python).exists, f"/etc/clustercheck/python names {python}, which does not exist"
    return python


def test_recorded_python_imports_pinned_torch(host, runner):
    python = _recorded_python(host)
    want = setting(runner, host.backend.get_hostname(), "python_env_torch_version", "python_env")
    if not want:  # an environment without torch (python_env_torch_version: ""): nothing pinned to compare
        return
    got = host.check_output(f"{python} -c 'import torch; print(torch.__version__)'")
    assert got.split("+")[0] == want, f"torch {got} in {python}, want {want}"


def test_recorded_python_imports_pinned_numpy(host, runner):
    """torch needs numpy for dist.all_gather_object and the other object collectives ("Numpy is not available"), and
    warns without it on every import; the role installs it with torch."""
    python = _recorded_python(host)
    name = host.backend.get_hostname()
    want = setting(runner, name, "python_env_numpy_version", "python_env")
    if not setting(runner, name, "python_env_torch_version", "python_env") or not want:
        return  # no torch, or numpy left out (python_env_numpy_version: ""): nothing pinned to compare
    result = host.run(f"{python} -c 'import numpy; print(numpy.__version__)'")
    assert result.rc == 0, f"numpy does not import in {python}: {result.stderr.strip()[-300:]}"
    assert result.stdout.strip() == want, f"numpy {result.stdout.strip()} in {python}, want {want}"


def test_recorded_python_imports_every_listed_package(host, runner):
    python = _recorded_python(host)
    for requirement in setting(runner, host.backend.get_hostname(), "python_env_packages", "python_env"):
        name = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)[0]
        module = name.lower().replace("-", "_")
        result = host.run(f"{python} -c 'import {module}'")
        assert result.rc == 0, f"{name} ({requirement}) does not import in {python}: {result.stderr.strip()[-300:]}"


# Started by the environment's own jupyter_client, as Jupyter does: the kernel registered under NAME answers with
# the python it runs and the torch it imports.
KERNEL_PROBE = """
import sys
from jupyter_client.manager import start_new_kernel
manager, client = start_new_kernel(kernel_name=sys.argv[1], startup_timeout=120)
try:
    found = []
    def keep(message):
        if message["msg_type"] == "stream" and message["content"]["name"] == "stdout":  # not torch's warnings
            found.append(message["content"]["text"])
    code = "import sys, torch; print(sys.executable, torch.__version__)"
    reply = client.execute_interactive(code, timeout=120, output_hook=keep)
    print(reply["content"]["status"], "".join(found).strip())
finally:
    client.stop_channels()
    manager.shutdown_kernel(now=True)
"""


def test_the_jupyter_kernel_runs_the_environments_python(host, runner):
    name = host.backend.get_hostname()
    if not setting(runner, name, "python_env_jupyter_kernel", "python_env"):
        pytest.skip("python_env_jupyter_kernel is off: no Jupyter kernel to check")
    python = _recorded_python(host)
    variables = runner.get_variables(name)
    user = variables.get("python_env_jupyter_kernel_user") or variables.get("ansible_user") or "root"
    kernel = variables.get("python_env_jupyter_kernel_name") or setting(runner, name, "python_env_name", "python_env")
    as_user = f"runuser -u {user} -- env HOME=$(getent passwd {user} | cut -d: -f6) {python}"
    listed = host.run(f"{as_user} -m jupyter kernelspec list --json")
    assert listed.rc == 0, listed.stderr[-500:]
    specs = json.loads(listed.stdout)["kernelspecs"]
    assert kernel in specs, f"no Jupyter kernel {kernel} for {user}: {sorted(specs)}"
    assert specs[kernel]["spec"]["argv"][0] == python, specs[kernel]["spec"]["argv"]
    probe = host.run(f"{as_user} -c {shlex.quote(KERNEL_PROBE)} {kernel}")
    assert probe.rc == 0, probe.stderr[-1000:]
    status, executable, *_ = probe.stdout.split()
    assert (status, executable) == ("ok", python), probe.stdout
