"""Work the core stage gives a node's GPUs: DCGM's diagnostic (--dcgm-level), each GPU measured (gpubench, for the
gpu.* figure checks) and the GPUs under load (gpuburn, with run --burn)."""

from __future__ import annotations

from clustercheck.checks.gpu import DCGM_DEADLINES
from clustercheck.facts import parse
from clustercheck.facts.burn import GpuBurn
from clustercheck.facts.model import DcgmDiag, GpuBench, NodeFacts
from clustercheck.stages import Context, nodeprogram
from clustercheck.transport import Transport


def dcgm_diag(dcgmi: str, level: int, transport: Transport, host_dir) -> DcgmDiag:
    """`dcgmi diag -r LEVEL` with the level's deadline; its output kept as hosts/<node>/dcgm-diag.txt."""
    deadline = DCGM_DEADLINES[level]
    result = nodeprogram.run(transport, [dcgmi, "diag", "-r", str(level)], timeout=deadline)
    (host_dir / "dcgm-diag.txt").write_text(result.stdout + result.stderr)
    parsed = parse.parse_dcgmi_diag(result.stdout)
    error = None
    if result.timed_out:
        error = f"no verdict within {deadline:.0f} s (stopped)"
    elif not parsed["tests"]:
        error = "no test result in its output" if result.ok else result.cause()
    return DcgmDiag(level, parsed["tests"], parsed["metadata"], error)


def gpu_program(
    facts: NodeFacts, transport: Transport, ctx: Context, host_dir, program: str, *args: str, timeout: float
) -> nodeprogram.Answer | str:
    """PROGRAM of the bundle on the node's GPUs (gpubench, gpuburn), run by torch's python (in the image with
    --container), its answer kept as hosts/<node>/PROGRAM.json; or why it cannot run (torch does not import)."""
    problem = facts.torch_problem
    if problem:
        return f"torch does not import ({problem})"
    box = ctx.config.container
    return nodeprogram.bundled(
        transport,
        facts.torch_python,
        program,
        *args,
        timeout=timeout,
        kept=host_dir / f"{program}.json",
        wrap=None if box is None else lambda argv: box.run(argv, workdir=transport.workdir, gpus=True),
    )


def measure_gpus(facts: NodeFacts, transport: Transport, ctx: Context, host_dir) -> GpuBench:
    """Every GPU of the node measured at once (gpubench), or why not (torch does not import, the program failed)."""
    answer = gpu_program(facts, transport, ctx, host_dir, "gpubench", timeout=ctx.config.command_timeout)
    if isinstance(answer, str):
        return GpuBench(problem=answer)
    if answer.failure is not None:
        return GpuBench(failure=answer.failure.cause)
    return GpuBench.from_answer(answer.value)


def burn_gpus(facts: NodeFacts, transport: Transport, ctx: Context, host_dir) -> GpuBurn:
    """Every GPU of the node under load for --burn's length (gpuburn), or why not. Its deadline: the length, and
    the facts collector's deadline for torch's import, the fixed computations and the kernel log."""
    seconds = ctx.config.burn_seconds or 0
    timeout = seconds + ctx.config.command_timeout
    answer = gpu_program(facts, transport, ctx, host_dir, "gpuburn", "--seconds", f"{seconds:g}", timeout=timeout)
    if isinstance(answer, str):
        return GpuBurn(problem=answer)
    if answer.failure is not None:
        return GpuBurn(failure=answer.failure.cause)
    return GpuBurn.from_answer(answer.value)
