# Every detached job's directory on a node (launcher/detached.py: list_command), run as `sh -c` without arguments:
# "JOB ACTIVE-STATE EXIT-STATUS STARTED" per line ("-" when not known).
# Shell, not Python: `clustercheck jobs` runs it where the node's Python is not known.
# The user flag for systemctl (a user unit unless root); a missing lingering is said, not refused, here.
uf=""
if [ "$(id -u)" != 0 ]; then
  uf=--user
  if [ "$(loginctl show-user "$(id -un)" -p Linger --value 2>/dev/null)" != yes ]; then
    echo "$(id -un) has no lingering systemd user manager, so a detached job would end at logout: run: sudo loginctl enable-linger $(id -un)" >&2
    true
  fi
fi
for d in "$HOME/.local/state/clustercheck/jobs"/*/; do
  [ -d "$d" ] || continue
  j=$(basename "$d")
  s=$(systemctl $uf is-active "clustercheck-job-$j.service" 2>/dev/null || true)
  e=$(cat "$d/exit-status" 2>/dev/null || true)
  t=$(cat "$d/started" 2>/dev/null || true)
  echo "$j ${s:-unknown} ${e:--} ${t:--}"
done
