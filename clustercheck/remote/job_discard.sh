# A detached job that could not start on every node, discarded where it did (launcher/detached.py:
# discard_command), run as `sh -c` with argv: JOB: its unit stopped and its directory removed, so that
# `jobs --all` does not list a job that never ran.
# The user flag for systemctl (a user unit unless root); a missing lingering is said, not refused, here.
uf=""
if [ "$(id -u)" != 0 ]; then
  uf=--user
  if [ "$(loginctl show-user "$(id -un)" -p Linger --value 2>/dev/null)" != yes ]; then
    echo "$(id -un) has no lingering systemd user manager, so a detached job would end at logout: run: sudo loginctl enable-linger $(id -un)" >&2
    true
  fi
fi
systemctl $uf stop "clustercheck-job-$1.service" 2>/dev/null || true
rm -rf "$HOME/.local/state/clustercheck/jobs"/"$1"
