"""OpenSSH's client options as clustercheck's SSH transport treats them: each one honoured, harmlessly ignored or
refused, with the reason, in one table; and the arguments Ansible passes to ssh (`ansible_ssh_common_args`,
`ansible_ssh_extra_args`, `ansible_ssh_args`) read into those options, the way ssh(1) reads its command line.

An inventory that works for Ansible (which runs OpenSSH) must work for clustercheck (which runs paramiko), or fail
at once with one line naming the option and the node: an option that changes how the connection is made and that
clustercheck cannot do is refused before any node is contacted, never left to end in a timeout.

Pure (the standard library only): the inventory reads arguments with it, transport/params.py judges the options a
node ends up with (inventory, then ssh_config) with it.
"""

from __future__ import annotations

import fnmatch
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field

HONOURED = "honoured"
IGNORED = "ignored"
REFUSED = "refused"

# Why the ignored options are harmless, said once for each family.
_NEGOTIATED = "paramiko negotiates among what the server offers; a server that accepts none fails with a named error"
_UNATTENDED = "clustercheck authenticates unattended, by key and agent (ssh-agent), as Ansible without sshpass"
_NO_FORWARDS = "clustercheck runs commands only, it opens no forwarding, X11 or tunnel"
_LOCAL_ONLY = "it changes only ssh's own behaviour on the controller (logging, control sockets, the terminal)"
_HOST_KEYS = (
    "clustercheck's own host-key rule applies (known_hosts; an unknown key is a one-line error naming the fix, "
    "--accept-new-host-keys to record it)"
)


@dataclass(frozen=True)
class Option:
    """How clustercheck treats one ssh_config keyword; REFUSE_IF, when given, narrows a refusal to those values
    (a value it returns True for is refused, any other is honoured or ignored as KIND says)."""

    name: str  # as ssh_config(5) spells it
    kind: str  # HONOURED, IGNORED or REFUSED
    reason: str
    refuse_if: Callable[[str], bool] | None = None
    refusal: str = ""  # the reason when refuse_if refuses


def _no(value: str) -> bool:
    return value.strip().lower() == "no"


def _yes(value: str) -> bool:
    return value.strip().lower() == "yes"


def _set(value: str) -> bool:
    return value.strip().lower() not in ("", "none")


def _without_publickey(value: str) -> bool:
    return "publickey" not in [m.strip().lower() for m in value.split(",")]


def _another_agent(value: str) -> bool:
    return value.strip() not in ("none", "SSH_AUTH_SOCK", "$SSH_AUTH_SOCK", "${SSH_AUTH_SOCK}")


_OPTIONS = [
    # Honoured: transport/params.py and transport/connection.py do what OpenSSH does with them.
    Option("Host", HONOURED, "ssh_config's host blocks (paramiko's SSHConfig)"),
    Option(
        "Match",
        HONOURED,
        "paramiko evaluates all, canonical, final, host, originalhost, user, localuser and exec (with Python's "
        "invoke; `user` is the config's User, else the local user); another criterion is refused where the file "
        "is read",
    ),
    Option("Include", HONOURED, "expanded where it stands, as OpenSSH does (transport/params.py)"),
    Option("IgnoreUnknown", HONOURED, "the unknown options it names are ignored, as OpenSSH ignores them"),
    Option("Hostname", HONOURED, "the address connected to"),
    Option("Port", HONOURED, "the port connected to"),
    Option("User", HONOURED, "the user logged in as"),
    Option("IdentityFile", HONOURED, "the keys offered, in order"),
    Option("UserKnownHostsFile", HONOURED, "the known_hosts files the host key is checked against"),
    Option("GlobalKnownHostsFile", HONOURED, "the system known_hosts files"),
    Option("ProxyCommand", HONOURED, "run through the user's shell with %h %p %r %n %% substituted, as OpenSSH does"),
    Option("ProxyJump", HONOURED, "each hop in turn (its own user, port, key and host key), over direct-tcpip"),
    Option("ConnectTimeout", HONOURED, "the TCP connect timeout for that node (else --connect-timeout)"),
    Option("CanonicalizeHostname", HONOURED, "paramiko's SSHConfig canonicalizes as OpenSSH does"),
    Option("CanonicalDomains", HONOURED, "with CanonicalizeHostname"),
    Option("CanonicalizeFallbackLocal", HONOURED, "with CanonicalizeHostname"),
    Option("CanonicalizeMaxDots", HONOURED, "with CanonicalizeHostname"),
    Option("CanonicalizePermittedCNAMEs", IGNORED, "CNAMEs are followed as the resolver follows them"),
    # Refused, or refused for some values: clustercheck cannot connect as OpenSSH would.
    Option(
        "PreferredAuthentications",
        IGNORED,
        "clustercheck tries its keys and the agent's (publickey)",
        refuse_if=_without_publickey,
        refusal="clustercheck authenticates by public key only (its keys and the agent's), and this leaves none",
    ),
    Option(
        "PubkeyAuthentication",
        HONOURED,
        "public keys are how clustercheck authenticates",
        refuse_if=_no,
        refusal="clustercheck authenticates by public key only (its keys and the agent's)",
    ),
    Option(
        "GSSAPIAuthentication",
        IGNORED,
        f"{_UNATTENDED}; GSSAPI as the only way in is refused through PreferredAuthentications",
    ),
    Option(
        "PKCS11Provider",
        IGNORED,
        "none: no PKCS#11 token",
        refuse_if=_set,
        refusal="paramiko has no PKCS#11 support: a key on a smartcard or token cannot be offered; "
        "load it into ssh-agent (ssh-add -s) and drop the option",
    ),
    Option(
        "SecurityKeyProvider",
        IGNORED,
        "used only for FIDO keys (sk-*), which paramiko cannot load: such a key fails authentication, named",
    ),
    Option(
        "CertificateFile",
        IGNORED,
        "none: no certificate",
        refuse_if=_set,
        refusal="paramiko reads a certificate only beside its key (KEY-cert.pub); put it there and drop the option",
    ),
    Option(
        "IdentityAgent",
        HONOURED,
        "the agent at $SSH_AUTH_SOCK",
        refuse_if=_another_agent,
        refusal="clustercheck uses the agent at $SSH_AUTH_SOCK only: set SSH_AUTH_SOCK to it instead",
    ),
    Option(
        "KnownHostsCommand",
        IGNORED,
        "none",
        refuse_if=_set,
        refusal="clustercheck reads host keys from known_hosts files only; write the keys there",
    ),
    Option(
        "HostKeyAlias",
        IGNORED,
        "none",
        refuse_if=_set,
        refusal="clustercheck looks a host key up under the host's name and port, not an alias",
    ),
    Option(
        "RevokedHostKeys",
        IGNORED,
        "none",
        refuse_if=_set,
        refusal="clustercheck cannot read a revocation list, and would accept a revoked key",
    ),
    Option("BindAddress", REFUSED, "clustercheck connects from the address the system chooses, it cannot bind one"),
    Option("BindInterface", REFUSED, "clustercheck connects through the interface the system chooses"),
    Option(
        "ProxyUseFdpass",
        IGNORED,
        "no: the ProxyCommand's output is the connection",
        refuse_if=_yes,
        refusal="clustercheck reads the ProxyCommand's output; it cannot take a passed file descriptor",
    ),
    Option(
        "RefuseConnection",
        IGNORED,
        "no",
        refuse_if=_yes,
        refusal="ssh refuses to connect to this host (the site's configuration says so)",
    ),
    # Harmlessly ignored: they change nothing about whether and how the connection is made.
    Option("StrictHostKeyChecking", IGNORED, _HOST_KEYS),
    Option("CheckHostIP", IGNORED, _HOST_KEYS),
    Option("UpdateHostKeys", IGNORED, _HOST_KEYS),
    Option("VerifyHostKeyDNS", IGNORED, _HOST_KEYS),
    Option("HashKnownHosts", IGNORED, "keys clustercheck records are written as ssh-keyscan writes them"),
    Option("NoHostAuthenticationForLocalhost", IGNORED, _HOST_KEYS),
    Option("VisualHostKey", IGNORED, _LOCAL_ONLY),
    Option("FingerprintHash", IGNORED, "clustercheck shows SHA256 fingerprints"),
    Option("IdentitiesOnly", IGNORED, "the agent's keys are offered after the files'"),
    Option("AddKeysToAgent", IGNORED, _LOCAL_ONLY),
    Option("PasswordAuthentication", IGNORED, _UNATTENDED),
    Option("KbdInteractiveAuthentication", IGNORED, _UNATTENDED),
    Option("KbdInteractiveDevices", IGNORED, _UNATTENDED),
    Option("ChallengeResponseAuthentication", IGNORED, _UNATTENDED),
    Option("NumberOfPasswordPrompts", IGNORED, _UNATTENDED),
    Option("BatchMode", IGNORED, "clustercheck never prompts"),
    Option("GSSAPIDelegateCredentials", IGNORED, _UNATTENDED),
    Option("GSSAPIKeyExchange", IGNORED, _UNATTENDED),
    Option("GSSAPIClientIdentity", IGNORED, _UNATTENDED),
    Option("GSSAPIServerIdentity", IGNORED, _UNATTENDED),
    Option("GSSAPIRenewalForcesRekey", IGNORED, _UNATTENDED),
    Option("GSSAPITrustDns", IGNORED, _UNATTENDED),
    Option("HostbasedAuthentication", IGNORED, _UNATTENDED),
    Option("EnableSSHKeysign", IGNORED, _UNATTENDED),
    Option("Ciphers", IGNORED, _NEGOTIATED),
    Option("MACs", IGNORED, _NEGOTIATED),
    Option("KexAlgorithms", IGNORED, _NEGOTIATED),
    Option("HostKeyAlgorithms", IGNORED, _NEGOTIATED),
    Option("PubkeyAcceptedAlgorithms", IGNORED, _NEGOTIATED),
    Option("PubkeyAcceptedKeyTypes", IGNORED, _NEGOTIATED),
    Option("HostbasedAcceptedAlgorithms", IGNORED, _NEGOTIATED),
    Option("CASignatureAlgorithms", IGNORED, _NEGOTIATED),
    Option("RequiredRSASize", IGNORED, _NEGOTIATED),
    Option("RekeyLimit", IGNORED, _NEGOTIATED),
    Option("WarnWeakCrypto", IGNORED, _NEGOTIATED),
    Option("Compression", IGNORED, "a speed setting; commands' output is small"),
    Option("AddressFamily", IGNORED, "the address is resolved as the system resolves it"),
    Option("ConnectionAttempts", IGNORED, "a node not reached is reported as such, once"),
    Option("ControlMaster", IGNORED, f"{_LOCAL_ONLY}; clustercheck keeps its own connections open"),
    Option("ControlPath", IGNORED, _LOCAL_ONLY),
    Option("ControlPersist", IGNORED, _LOCAL_ONLY),
    Option("ServerAliveInterval", IGNORED, "clustercheck sends its own keepalive (every 5 s)"),
    Option("ServerAliveCountMax", IGNORED, "clustercheck sends its own keepalive (every 5 s)"),
    Option("TCPKeepAlive", IGNORED, "clustercheck sends its own keepalive (every 5 s)"),
    Option("ChannelTimeout", IGNORED, "each command has its own deadline"),
    Option("IPQoS", IGNORED, "a traffic class, not a way in"),
    Option("LogLevel", IGNORED, _LOCAL_ONLY),
    Option("LogVerbose", IGNORED, _LOCAL_ONLY),
    Option("SyslogFacility", IGNORED, _LOCAL_ONLY),
    Option("EscapeChar", IGNORED, _LOCAL_ONLY),
    Option("EnableEscapeCommandline", IGNORED, _LOCAL_ONLY),
    Option("ObscureKeystrokeTiming", IGNORED, _LOCAL_ONLY),
    Option("RequestTTY", IGNORED, "clustercheck's commands need no terminal"),
    Option("SessionType", IGNORED, "clustercheck runs commands"),
    Option("StdinNull", IGNORED, "clustercheck runs commands"),
    Option("ForkAfterAuthentication", IGNORED, _LOCAL_ONLY),
    Option("RemoteCommand", IGNORED, "clustercheck runs its own commands (so does Ansible)"),
    Option("LocalCommand", IGNORED, _LOCAL_ONLY),
    Option("PermitLocalCommand", IGNORED, _LOCAL_ONLY),
    Option("SendEnv", IGNORED, "clustercheck sets the environment of its commands itself"),
    Option("SetEnv", IGNORED, "clustercheck sets the environment of its commands itself"),
    Option("Tag", IGNORED, "only selects Match tagged blocks, which are refused where the file is read"),
    Option("ForwardAgent", IGNORED, _NO_FORWARDS),
    Option("ForwardX11", IGNORED, _NO_FORWARDS),
    Option("ForwardX11Timeout", IGNORED, _NO_FORWARDS),
    Option("ForwardX11Trusted", IGNORED, _NO_FORWARDS),
    Option("XAuthLocation", IGNORED, _NO_FORWARDS),
    Option("LocalForward", IGNORED, _NO_FORWARDS),
    Option("RemoteForward", IGNORED, _NO_FORWARDS),
    Option("DynamicForward", IGNORED, _NO_FORWARDS),
    Option("GatewayPorts", IGNORED, _NO_FORWARDS),
    Option("ExitOnForwardFailure", IGNORED, _NO_FORWARDS),
    Option("ClearAllForwardings", IGNORED, _NO_FORWARDS),
    Option("PermitRemoteOpen", IGNORED, _NO_FORWARDS),
    Option("StreamLocalBindMask", IGNORED, _NO_FORWARDS),
    Option("StreamLocalBindUnlink", IGNORED, _NO_FORWARDS),
    Option("Tunnel", IGNORED, _NO_FORWARDS),
    Option("TunnelDevice", IGNORED, _NO_FORWARDS),
    Option(
        "SmartcardDevice",
        IGNORED,
        "none: no smartcard",
        refuse_if=_set,
        refusal="paramiko has no smartcard (PKCS#11) support; load the key into ssh-agent and drop the option",
    ),
    Option("UseKeychain", IGNORED, "Apple's ssh: passphrases kept in the keychain; the agent's keys are offered"),
    Option("KeepAlive", IGNORED, "clustercheck sends its own keepalive (every 5 s)"),
    Option("Cipher", IGNORED, "SSH protocol 1 only"),
    Option("CompressionLevel", IGNORED, "SSH protocol 1 only"),
    Option("RSAAuthentication", IGNORED, "SSH protocol 1 only"),
    Option("RhostsRSAAuthentication", IGNORED, "SSH protocol 1 only"),
    Option("HostbasedKeyTypes", IGNORED, _NEGOTIATED),
    Option("Protocol", IGNORED, "SSH protocol 2 is the only one"),
    Option("UseRoaming", IGNORED, "removed from OpenSSH"),
    Option("UsePrivilegedPort", IGNORED, "removed from OpenSSH"),
]
OPTIONS: dict[str, Option] = {o.name.lower(): o for o in _OPTIONS}

# ssh(1)'s command-line flags: the option each one sets (None: it sets none that matters here), and whether it takes
# an argument. -o and -F are read apart.
_FLAG_OPTIONS: dict[str, tuple[str | None, str | None]] = {
    "4": ("AddressFamily", "inet"),
    "6": ("AddressFamily", "inet6"),
    "A": ("ForwardAgent", "yes"),
    "a": ("ForwardAgent", "no"),
    "C": ("Compression", "yes"),
    "f": ("ForkAfterAuthentication", "yes"),
    "G": (None, None),
    "g": ("GatewayPorts", "yes"),
    "K": ("GSSAPIDelegateCredentials", "yes"),
    "k": ("GSSAPIDelegateCredentials", "no"),
    "M": ("ControlMaster", "yes"),
    "N": ("SessionType", "none"),
    "n": ("StdinNull", "yes"),
    "q": ("LogLevel", "quiet"),
    "s": ("SessionType", "subsystem"),
    "T": ("RequestTTY", "no"),
    "t": ("RequestTTY", "yes"),
    "V": (None, None),
    "v": ("LogLevel", "verbose"),
    "X": ("ForwardX11", "yes"),
    "x": ("ForwardX11", "no"),
    "Y": ("ForwardX11Trusted", "yes"),
    "y": (None, None),
}
_FLAG_ARGUMENTS: dict[str, str | None] = {
    "B": "BindInterface",
    "b": "BindAddress",
    "c": "Ciphers",
    "D": "DynamicForward",
    "E": None,  # a log file
    "e": "EscapeChar",
    "I": "PKCS11Provider",
    "i": "IdentityFile",
    "J": "ProxyJump",
    "L": "LocalForward",
    "l": "User",
    "m": "MACs",
    "O": None,  # a control command
    "P": "Tag",
    "p": "Port",
    "Q": None,  # a query
    "R": "RemoteForward",
    "S": "ControlPath",
    "W": None,  # a stdio forward
    "w": "TunnelDevice",
}
_KEYWORD = re.compile(r"\s*(\w+)(?:\s*=\s*|\s+)(.*)", re.S)
_PROXIES = ("proxycommand", "proxyjump")


class ArgumentError(ValueError):
    """Arguments ssh could not read; the message says why."""


@dataclass
class SshArgs:
    """What a node's ssh arguments say: options by lower-case keyword, first value winning as in OpenSSH, and the
    configuration file -F names (read instead of ~/.ssh/config and /etc/ssh/ssh_config)."""

    options: dict[str, str] = field(default_factory=dict)
    config_file: str | None = None

    def set(self, keyword: str, value: str) -> None:
        key = keyword.lower()
        # ProxyCommand and ProxyJump exclude each other: the first given wins (ssh_config(5)).
        if key in _PROXIES and any(k in self.options for k in _PROXIES):
            return
        self.options.setdefault(key, value)


def parse_args(args: str) -> SshArgs:
    """The options and -F file in ssh's arguments ARGS (`-o ProxyCommand="ssh -W %h:%p bastion" -i key -p 2222`),
    as ssh(1) reads them (flags may be grouped, an argument may follow its flag or be the next word)."""
    try:
        words = shlex.split(args)
    except ValueError as exc:
        raise ArgumentError(f"cannot read the ssh arguments {args!r}: {exc}") from exc
    parsed = SshArgs()
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if not word.startswith("-") or word == "-":
            continue  # a host name or command: not Ansible's to pass here, and nothing ssh_config sets
        letters = word[1:]
        while letters:
            flag, letters = letters[0], letters[1:]
            if flag in _FLAG_OPTIONS:
                keyword, value = _FLAG_OPTIONS[flag]
                if keyword:
                    parsed.set(keyword, value or "")
                continue
            if flag != "o" and flag != "F" and flag not in _FLAG_ARGUMENTS:
                raise ArgumentError(f"ssh has no option -{flag} (in {args!r})")
            if not letters:
                if i >= len(words):
                    raise ArgumentError(f"-{flag} needs an argument (in {args!r})")
                letters, i = words[i], i + 1
            _apply(parsed, flag, letters)
            letters = ""
    return parsed


def _apply(parsed: SshArgs, flag: str, argument: str) -> None:
    if flag == "F":
        parsed.config_file = parsed.config_file or argument
    elif flag == "o":
        match = _KEYWORD.fullmatch(argument)
        if not match:
            raise ArgumentError(f"-o {argument}: not an option (Keyword=value)")
        value = match[2].strip()
        if len(value) > 1 and value[0] == value[-1] == '"':
            value = value[1:-1]
        parsed.set(match[1], value)
    elif _FLAG_ARGUMENTS[flag]:
        parsed.set(str(_FLAG_ARGUMENTS[flag]), argument)


def refusal(options: dict[str, object]) -> tuple[str, str, str] | None:
    """The first option of OPTIONS (lower-case keyword -> value, as merged for one node) clustercheck cannot honour:
    (its name, its value, why); None when every one is honoured or harmless. A keyword OpenSSH does not know is
    refused as OpenSSH refuses it, unless IgnoreUnknown names it."""
    unknown_ok = str(options.get("ignoreunknown") or "").replace(",", " ").split()
    for key, raw in options.items():
        value = " ".join(str(v) for v in raw) if isinstance(raw, list) else ("none" if raw is None else str(raw))
        option = OPTIONS.get(key)
        if option is None:
            if any(fnmatch.fnmatch(key, p.lower()) for p in unknown_ok):
                continue
            return key, value, "not an ssh_config option (OpenSSH refuses it too, unless IgnoreUnknown names it)"
        if option.kind == REFUSED:
            return option.name, value, option.reason
        if option.refuse_if is not None and option.refuse_if(value):
            return option.name, value, option.refusal
    return None


def table() -> list[Option]:
    """Every option, in the table's order (for the documentation)."""
    return list(_OPTIONS)
