"""Why a TCP connection to an SSH port gave no SSH banner, from how the wait for it ended and what the server
sent instead (pure: ssh.py's connection reads the facts, this says what they mean)."""

from __future__ import annotations

GREETING_LINES = 3  # lines of a server's non-SSH greeting kept to quote


def no_banner(error: BaseException | None, greeting: list[str], banner_timeout: float, elapsed: float) -> str:
    """Why a TCP connection gave no SSH banner, from how waiting for it ended (ERROR: EOFError or a
    ConnectionError when the connection was closed, a timeout when nothing came), what the server sent instead
    (GREETING) and the seconds from connecting to the end (ELAPSED).

    A close and a reset are one case: paramiko sends its own banner first, and a socket the server closed
    answers that with a reset, so either can be seen for either."""
    said = " | ".join(line.strip() for line in greeting if line.strip())
    if said in REFUSALS:
        return f"sshd refused the connection, saying {said!r} ({REFUSALS[said]})"
    if said:
        return (
            f"the server on that port answered {said!r}, not an SSH banner (a service other than sshd listens "
            "there: check the port, `ss -tlnp` on the node)"
        )
    if isinstance(error, EOFError | ConnectionError):
        return (
            f"the server closed (or reset) the connection {elapsed:.1f} s after connecting, without an SSH banner: "
            "sshd refusing new connections (its MaxStartups limit of unauthenticated connections at once, "
            "OpenSSH's PerSourcePenalties, TCP wrappers' /etc/hosts.deny: `journalctl -u ssh` on the node says "
            "which), a firewall or load balancer cutting the connection, or a service other than sshd on that port"
        )
    if error is None or isinstance(error, TimeoutError):
        return (
            f"sshd accepted the connection but sent no SSH banner within {banner_timeout:.0f} s (sshd hung or "
            "overloaded, or no SSH server on that port)"
        )
    return f"reading the server's SSH banner failed after {elapsed:.1f} s: {error}"


# What OpenSSH's sshd sends, in place of its banner, to a connection it refuses (8.2's drop_connection: over
# MaxStartups), and what that means.
REFUSALS = {
    "Exceeded MaxStartups": "too many unauthenticated connections to it at once, sshd_config's MaxStartups: "
    "fewer at once (--forks), or a higher MaxStartups",
}
