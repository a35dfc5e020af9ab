"""nvidia_driver, cuda_toolkit, nccl: GPUs answer, and the NVIDIA stack cannot be upgraded behind your back."""

import pytest

HELD_PATTERNS = [
    "nvidia-open-*",
    "cuda-drivers-*",
    "nvidia-driver-*",
    "libnvidia-compute-*",
    "nvidia-fabricmanager-*",
    "cuda-toolkit-*",
    "cudnn9-cuda-*",
    "libnccl2",
    "libnccl-dev",
]


def _has_nvidia_gpu(host) -> bool:
    devices = host.run("for d in /sys/bus/pci/devices/*; do echo $(cat $d/vendor) $(cat $d/class); done").stdout
    return any(line.startswith("0x10de 0x03") for line in devices.splitlines())


def test_installed_nvidia_packages_are_held(host):
    installed = host.run(
        "dpkg-query -W -f '${db:Status-Abbrev} ${Package}\\n' "
        + " ".join(f"'{p}'" for p in HELD_PATTERNS)
        + " 2>/dev/null"
    ).stdout
    names = [line.split()[1] for line in installed.splitlines() if line.startswith("ii")]
    held = set(host.check_output("apt-mark showhold").split())
    not_held = [n for n in names if n not in held]
    assert not not_held, f"installed but not held (an upgrade could break the driver/CUDA match): {not_held}"


def test_nvidia_smi_answers_where_a_gpu_is_present(host):
    if not _has_nvidia_gpu(host):
        pytest.skip("no NVIDIA GPU on this node's PCI bus")
    result = host.run("nvidia-smi -L")
    assert result.rc == 0 and "GPU 0" in result.stdout, f"nvidia-smi fails: {result.stderr.strip()}"
