# A detached job's output on a node (launcher/detached.py: logs_command), run as `sh -c` with argv: JOB, and
# "follow" to follow it while the job runs. Exit 4 (detached.NO_JOB): the node has no such job.
# Shell, not Python: `clustercheck logs` runs it where the node's Python is not known.
dir="$HOME/.local/state/clustercheck/jobs"/$1
if [ ! -d "$dir" ]; then
  echo "no job $1 here" >&2
  exit 4
fi
if [ "$2" = follow ]; then
  # The user flag for systemctl (job_user.sh); a missing lingering is said, not refused, here.
  user_flag
  pid=$(systemctl $uf show -p MainPID --value "clustercheck-job-$1.service" 2>/dev/null || echo 0)
  if [ "${pid:-0}" != 0 ]; then
    exec tail -n +1 -F --pid="$pid" "$dir/output.log" 2>/dev/null
  fi
fi
cat "$dir/output.log"
