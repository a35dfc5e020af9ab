# Every detached job's directory on a node (launcher/detached.py: list_command), run as `sh -c` without arguments:
# "JOB ACTIVE-STATE EXIT-STATUS STARTED" per line ("-" when not known).
# Shell, not Python: `clustercheck jobs` runs it where the node's Python is not known.
# The user flag for systemctl (job_user.sh); a missing lingering is said, not refused, here.
user_flag
for d in "$HOME/.local/state/clustercheck/jobs"/*/; do
  [ -d "$d" ] || continue
  j=$(basename "$d")
  s=$(systemctl $uf is-active "clustercheck-job-$j.service" 2>/dev/null || true)
  e=$(cat "$d/exit-status" 2>/dev/null || true)
  t=$(cat "$d/started" 2>/dev/null || true)
  echo "$j ${s:-unknown} ${e:--} ${t:--}"
done
