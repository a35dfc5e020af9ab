"""python_env: the recorded environment's python imports torch at the pinned version, and every package the
inventory lists in python_env_packages."""

import re

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


def test_recorded_python_imports_every_listed_package(host, runner):
    python = _recorded_python(host)
    for requirement in setting(runner, host.backend.get_hostname(), "python_env_packages", "python_env"):
        name = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)[0]
        module = name.lower().replace("-", "_")
        result = host.run(f"{python} -c 'import {module}'")
        assert result.rc == 0, f"{name} ({requirement}) does not import in {python}: {result.stderr.strip()[-300:]}"
