"""The documented exit codes of clustercheck; scripts rely on them, so they never change meaning. And UsageError,
the one way any part of clustercheck stops a command with one line and one of them."""

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0  # every check passed (warnings allowed)
    CHECK_FAILED = 1  # at least one check failed or errored
    INTERRUPTED = 2  # Ctrl-C or a signal
    INTERNAL_ERROR = 3  # a bug in clustercheck
    USAGE_ERROR = 4  # bad arguments, inventory or host-key error
    NO_HOSTS = 5  # no host matched
    NOT_STARTED = 6  # launch did not start the job: preflight failed, a node not ready, the code differs, or the
    # script does not compile


class UsageError(Exception):
    """Bad input, or a refusal before or instead of the work, in one line: the command prints it after `clustercheck:
    error:` and exits with CODE (a usage error unless the caller says which)."""

    def __init__(self, message: str, code: ExitCode = ExitCode.USAGE_ERROR) -> None:
        super().__init__(message)
        self.code = code
