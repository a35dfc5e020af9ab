"""The documented exit codes of clustercheck; scripts rely on them, so they never change meaning. And the ways any
part of clustercheck stops a command with one line and one of them: Stopped, and a class per outcome (UsageError,
NoHosts, JobNotStarted, WorkFailed), each with its exit code."""

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0  # every check passed (warnings allowed)
    CHECK_FAILED = 1  # at least one check failed or errored; jobs, logs, stop or a Slurm batch job: WorkFailed
    INTERRUPTED = 2  # Ctrl-C or a signal
    INTERNAL_ERROR = 3  # a bug in clustercheck
    USAGE_ERROR = 4  # bad arguments, inventory or host-key error: UsageError
    NO_HOSTS = 5  # no host matched, or Slurm granted no allocation: NoHosts
    NOT_STARTED = 6  # launch did not start the job: preflight failed, a node not ready, the code differs, or the
    # script does not compile: JobNotStarted


class Stopped(Exception):
    """A command stopped before, or instead of, its work, in one line: the command prints it after `clustercheck:
    error:` and exits with the class's CODE. Raise one of the classes below, which say what happened."""

    code: ExitCode = ExitCode.USAGE_ERROR

    def __init__(self, message: str) -> None:  # one line; the class, not the caller, says the exit code
        super().__init__(message)


class UsageError(Stopped):
    """Bad input: an option, an argument, the inventory, a file given, or a host key refused (exit 4)."""

    code = ExitCode.USAGE_ERROR


class NoHosts(Stopped):
    """No node to work on: none matched --hosts/--limit, or Slurm granted no allocation (exit 5)."""

    code = ExitCode.NO_HOSTS


class JobNotStarted(Stopped):
    """launch started no job: the preflight, a node, the code or the script refused it (exit 6)."""

    code = ExitCode.NOT_STARTED


class WorkFailed(Stopped):
    """The work was asked for and did not succeed: a job not stopped everywhere, nodes not asked, a Slurm batch job
    whose end, status or output could not be had (exit 1, as a failed check)."""

    code = ExitCode.CHECK_FAILED
