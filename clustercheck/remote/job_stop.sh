# A detached job stopped on a node (launcher/detached.py: stop_command), run as `sh -c` with argv: JOB. Prints
# "stopped", or "not-running"; exit 4 (detached.NO_JOB): the node has no such job.
# Shell, not Python: `clustercheck stop` runs it where the node's Python is not known.
# The user flag for systemctl (job_user.sh); a missing lingering is said, not refused, here.
user_flag
unit="clustercheck-job-$1.service"
if [ ! -d "$HOME/.local/state/clustercheck/jobs"/"$1" ]; then
  echo "no job $1 here" >&2
  exit 4
fi
if systemctl $uf is-active --quiet "$unit"; then
  systemctl $uf stop "$unit"
  : > "$HOME/.local/state/clustercheck/jobs"/"$1"/stopped
  echo stopped
else
  echo not-running
fi
