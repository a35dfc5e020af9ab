"""Each GPU judged as what it is (checks/gpuperf.py): an H200 against its own datasheet figures (before, its file had
none and a one-GPU H200 PASSed with nothing to compare), a MIG instance against its profile's share of the GPU
(before, against the whole GPU's datasheet: a WARN with a wrong fix), a GPU that hung named with its phase (before,
an entry without figures or error PASSed), the median beside the judged best, and the TF32 override variables that
change what "tf32" or "fp32" measures recorded and named. Inputs in the shape gpubench prints (test_gpuperf.gpu)."""

from __future__ import annotations

from test_gpuperf import H100, bench, gpu, h100
from wording import says

from clustercheck import expected
from clustercheck.checks import gpuperf
from clustercheck.facts.model import GpuBench
from clustercheck.model import Status

H200 = "NVIDIA H200"
MIG_1G = "NVIDIA H100 80GB HBM3 MIG 1g.10gb"  # how torch names a MIG instance (the example)


def h200() -> expected.Match:
    return expected.shipped().match([H200])


def test_a_one_gpu_h200_is_judged_against_its_datasheet_figures():
    healthy = bench(gpu(0, name=H200, bf16=780.0, memory=4300.0, h2d=55.0))
    for figures in (gpuperf.MATMUL, gpuperf.MEMORY, gpuperf.HOST):
        found = gpuperf.judge_node(healthy, h200(), figures)
        assert found.status is Status.PASS, found.message
        assert "judged against the node's other GPUs only" not in found.message
    slow = gpuperf.judge_node(bench(gpu(0, name=H200, bf16=400.0, memory=2500.0)), h200(), gpuperf.MATMUL)
    assert slow.status is Status.WARN and "bf16 multiply 400 TFLOP/s, under 50% of H200 SXM's 990" in slow.message
    memory = gpuperf.judge_node(bench(gpu(0, name=H200, memory=2500.0)), h200(), gpuperf.MEMORY)
    assert memory.status is Status.WARN and "under 60% of H200 SXM's 4800 GB/s" in memory.message
    host = gpuperf.judge_node(bench(gpu(0, name=H200, h2d=30.0)), h200(), gpuperf.HOST)
    assert host.status is Status.WARN and "host-to-device copy 30 GB/s, under H200 SXM's 48 GB/s" in host.message


def test_a_mig_instance_is_judged_against_its_profile_s_share_of_the_gpu():
    """A 1g.10gb slice of an H100 SXM multiplies at about a seventh of the whole GPU: 100 TFLOP/s is fine against
    1/7 of 989.5 (141), where the whole GPU's datasheet called it under 50%."""
    found = gpuperf.judge_node(bench(gpu(0, name=MIG_1G, bf16=100.0)), h100(), gpuperf.MATMUL)
    assert found.status is Status.PASS, found.message
    assert "MIG instance(s) 1g.10gb judged against their profile's share of the GPU" in found.message
    assert found.data["mig"]["GPU 0 (00000000:18:00.0)"]["slices"] == 1
    slow = gpuperf.judge_node(bench(gpu(0, name=MIG_1G, bf16=40.0)), h100(), gpuperf.MATMUL)
    assert slow.status is Status.WARN
    assert "bf16 multiply 40 TFLOP/s, under 50% of 141 TFLOP/s (a MIG 1g.10gb instance, 1/7 of the SMs" in (
        slow.message
    )
    memory = gpuperf.judge_node(bench(gpu(0, name=MIG_1G, memory=380.0)), h100(), gpuperf.MEMORY)
    assert memory.status is Status.PASS, memory.message  # 10 of 80 GB: an eighth of 3350 GB/s


def test_a_mig_instance_s_host_copies_are_judged_against_its_peers_only_and_say_why():
    found = gpuperf.judge_node(bench(gpu(0, name=MIG_1G, h2d=20.0)), h100(), gpuperf.HOST)
    assert found.status is Status.PASS
    assert "judged against the node's other instances only" in found.message and "copy engines" in found.message


def test_mig_shares_follow_nvidia_s_profile_table():
    h100_model = h100().model
    share = gpuperf.mig_share("NVIDIA H100 80GB HBM3 MIG 3g.40gb", h100_model)
    assert (share.profile, share.slices, share.of, share.memory) == ("3g.40gb", 3, 7, 0.5)
    assert gpuperf.mig_share("NVIDIA A30 MIG 2g.12gb", None).of == 4 and gpuperf.mig_share(H100, h100_model) is None
    assert gpuperf.mig_share("NVIDIA H100 80GB HBM3 MIG 1c.7g.80gb", h100_model).slices == 1


def test_a_gpu_that_hung_is_a_fail_naming_its_phase_and_the_others_figures_are_kept():
    hung = {"index": 1, "bus_id": "00000000:19:00.0", "name": H100, "phase": "tf32 multiply", "hung": True}
    found = gpuperf.judge_node(bench(gpu(0), hung), h100(), gpuperf.MATMUL)
    assert found.status is Status.FAIL
    assert "GPU 1 (00000000:19:00.0): not measured: did not finish (tf32 multiply), hung" in found.message
    assert found.data["gpus"][0]["matmul_bf16_tflops"] == 700.0
    assert says(found.data["gpus"][1]["error"], "did not finish", "tf32 multiply", "hung")


def test_the_median_is_kept_beside_the_best_which_is_judged():
    entry = gpu(0, matmul_tflops_median={"bf16": 690.0, "tf32": 370.0, "fp32": 49.0}, memory_gbps_median=2850.0)
    found = gpuperf.judge_node(bench(entry), h100(), gpuperf.MATMUL)
    row = found.data["gpus"][0]
    assert (row["matmul_bf16_tflops"], row["matmul_bf16_tflops_median"]) == (700.0, 690.0)
    assert found.data["judged"].startswith("the best of gpubench's repeats")
    memory = gpuperf.judge_node(bench(entry), h100(), gpuperf.MEMORY).data["gpus"][0]
    assert memory["memory_gbps_median"] == 2850.0


def test_the_tf32_override_variables_are_recorded_and_named_where_they_change_what_is_measured():
    def with_overrides(**variables) -> GpuBench:
        answer = {"cuda": True, "copy_counts": "read+written", "gpus": [gpu(0, matmul_tflops={"bf16": 700.0})]}
        answer["gpus"][0]["matmul_tflops"] |= {"tf32": 50.0, "fp32": 50.0}  # tf32 at float32's rate
        answer |= {"tf32_api": "torch.backends.cuda.matmul.fp32_precision", "tf32_overrides": variables}
        return GpuBench.from_answer(answer)

    quiet = gpuperf.judge_node(
        with_overrides(NVIDIA_TF32_OVERRIDE=None, TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=None), h100(), gpuperf.MATMUL
    )
    assert quiet.data["tf32_overrides"] == {"NVIDIA_TF32_OVERRIDE": None, "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE": None}
    assert "tf32 multiply 50 TFLOP/s, under 50% of H100 SXM's 494" in quiet.message  # slow, judged
    found = gpuperf.judge_node(with_overrides(NVIDIA_TF32_OVERRIDE="0"), h100(), gpuperf.MATMUL)
    assert found.status is Status.WARN
    assert "NVIDIA_TF32_OVERRIDE=0 on the node: the tf32 multiply measured float32 without TF32" in found.message
    assert "tf32 multiply 50 TFLOP/s, under" not in found.message  # not judged as TF32
    assert "Unset the variable" in (found.fix or "")
    forced = gpuperf.judge_node(with_overrides(TORCH_ALLOW_TF32_CUBLAS_OVERRIDE="1"), h100(), gpuperf.MATMUL)
    assert "the fp32 multiply measured TF32" in forced.message
