"""The data stage: --shared-dir is one writable filesystem on every node, and every --data-path has the same content
on every node (python3 only, no torch; checks/data.py judges what the nodes answer).

A node that differs here does not stop the torch stages: they do not read the user's data.
"""

from __future__ import annotations

import secrets

from clustercheck.checks import data, registry
from clustercheck.model import CheckResult
from clustercheck.stages import Context, Member, nodeprogram

NAME = "data"


def _ask(m: Member, ctx: Context, args: list[str], log: str) -> dict:
    """The node's `data` program's answer to ARGS, its output kept as LOG.json; ProgramFailed says why not."""
    answer = nodeprogram.bundled(
        m.transport,
        m.facts.python,
        "data",
        *args,
        timeout=ctx.config.command_timeout,
        kept=ctx.config.host_dir(m.name) / f"{log}.json",
        name=f"data {args[0]}",
    )
    return answer.json()


def _each(ctx: Context, members: list[Member], work) -> tuple[dict[str, dict], dict[str, str]]:
    answers: dict[str, dict] = {}
    errors: dict[str, str] = {}
    outcomes = ctx.reach.each(work, members, name=lambda m: m.name)
    for i, m in enumerate(members):
        got = outcomes.get(i)
        if isinstance(got, BaseException):
            errors[m.name] = f"{type(got).__name__}: {got}" if not isinstance(got, RuntimeError) else str(got)
        elif got is not None:
            answers[m.name] = got
    return answers, errors


def shared_dir(members: list[Member], ctx: Context, path: str) -> CheckResult:
    """The first node writes a token into PATH; every other node reads it back."""
    name = f"clustercheck-{members[0].transport.run_id}"
    token = secrets.token_hex(16)
    writer = members[0]
    answers, errors = _each(
        ctx,
        [writer],
        lambda m: _ask(m, ctx, ["shared", "--dir", path, "--name", name, "--write", token], "data-shared"),
    )
    if writer.name in answers and answers[writer.name].get("wrote"):
        more, more_errors = _each(
            ctx, members[1:], lambda m: _ask(m, ctx, ["shared", "--dir", path, "--name", name, "--read"], "data-shared")
        )
        answers.update(more)
        errors.update(more_errors)
    # The token is removed whatever the readers saw.
    _each(ctx, [writer], lambda m: _ask(m, ctx, ["shared", "--dir", path, "--name", name, "--remove"], "data-shared"))
    return data.evaluate_shared(path, writer.name, answers, errors, token)


def data_paths(members: list[Member], ctx: Context, paths: tuple[str, ...]) -> CheckResult:
    args = [a for p in paths for a in ("--path", p)]
    answers, errors = _each(ctx, members, lambda m: _ask(m, ctx, ["paths", *args], "data-paths"))
    return data.evaluate_paths(answers, errors, [m.name for m in members])


def run(members: list[Member], ctx: Context) -> list[CheckResult]:
    config = ctx.config
    results = []
    if config.shared_dir:
        results.append(shared_dir(members, ctx, config.shared_dir))
    else:
        results.append(registry.get(data.SHARED_DIR).not_run(None, "no --shared-dir given"))
    if config.data_paths:
        results.append(data_paths(members, ctx, config.data_paths))
    else:
        results.append(registry.get(data.PATHS).not_run(None, "no --data-path given (nor clustercheck_data_paths)"))
    return results
