"""NVIDIA's nvidia-bug-report.sh on a node after a GPU FAIL (standard library only, Python 3.8+; the controller
sends this file with `python -c`: stages/evidence.py's bug_report, which reads the answer).

argv: DIR SECONDS. The script writes its report into DIR, as root where the node user is root or may use
`sudo -n`, under coreutils' `timeout`, which stops it and everything it started (its process group) after SECONDS,
and KILLs it STOP_GRACE seconds later. Prints on stdout "absent" (no such script), or "rc=N" (timeout's exit status:
124 or 137 when it stopped the script) and, where a report was written, "file NAME" and the report in base64; the
script's own output goes to stderr (and stays in DIR/output).
"""

import base64
import os
import shutil
import subprocess
import sys

STOP_GRACE = 10  # seconds between timeout's TERM and its KILL (stages/evidence.py reads it)
REPORTS = ("nvidia-bug-report.log.gz", "nvidia-bug-report.log")  # the finished report, else the partial one


def as_root():
    """The command prefix that runs as root: none for root, `sudo -n` where the user may, else none."""
    if os.getuid() == 0:
        return []
    try:
        allowed = subprocess.run(["sudo", "-n", "true"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except OSError:
        return []
    return ["sudo", "-n"] if allowed.returncode == 0 else []


def shell_status(returncode):
    """A child's exit status as a shell's $? says it: 128 + the signal that killed it."""
    return 128 - returncode if returncode < 0 else returncode


def main(directory, limit):
    script = shutil.which("nvidia-bug-report.sh")
    if script is None:
        print("absent")
        return 0
    try:
        os.makedirs(directory, exist_ok=True)
        os.chdir(directory)
    except OSError as exc:
        print(exc, file=sys.stderr)
        return 1
    sudo = as_root()
    command = [*sudo, "timeout", "-k", str(STOP_GRACE), limit, script, "--output-file"]
    with open(os.path.join(directory, "output"), "wb") as output:
        ended = subprocess.run(
            [*command, os.path.join(directory, "nvidia-bug-report.log")],
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    print(f"rc={shell_status(ended.returncode)}", flush=True)
    with open(os.path.join(directory, "output"), "rb") as output:
        sys.stderr.write(output.read().decode(errors="replace"))
    for name in REPORTS:
        if os.path.isfile(name):
            print(f"file {name}")
            report = subprocess.run([*sudo, "cat", name], stdout=subprocess.PIPE).stdout
            print(base64.encodebytes(report).decode(), end="")
            return 0
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
