"""Helpers of the cluster integration tests (the torch_cluster fixture lives in tests/conftest.py)."""

from torchenv import PYTHON, VENV, ssh_client, ssh_run

__all__ = ["PYTHON", "VENV", "ssh_client", "ssh_run"]
