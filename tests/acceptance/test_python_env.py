"""python_env: the recorded environment's python imports torch at the pinned version."""

from acceptance_helpers import setting


def test_recorded_python_imports_pinned_torch(host, runner):
    record = host.file("/etc/clustercheck/python")
    assert record.exists, "/etc/clustercheck/python is missing (clustercheck reads the environment's python from it)"
    python = record.content_string.strip()
    assert host.file(python).exists, f"/etc/clustercheck/python names {python}, which does not exist"
    want = setting(runner, host.backend.get_hostname(), "python_env_torch_version", "python_env")
    got = host.check_output(f"{python} -c 'import torch; print(torch.__version__)'")
    assert got.split("+")[0] == want, f"torch {got} in {python}, want {want}"
