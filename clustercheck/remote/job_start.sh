# A detached job's start on a node (launcher/detached.py: start_command), run as `sh -c` with
# argv: JOB, the working directory ("" for $HOME, "@code" for the synced copy), the code archive ("" for none), then
# the command (env NAME=VALUE ... first). Torchrun runs under the transient unit clustercheck-job-JOB.service, its
# output in $HOME/.local/state/clustercheck/jobs/JOB/output.log; a wrapper in the unit records its exit status.
# Exit 3 (detached.REFUSED): the node lacks what a detached job needs, said in one line on stderr.
# Shell, not Python: it runs before the node's Python is known. TimeoutStopSec is detached.STOP_TIMEOUT.
set -e
# A detached job is a systemd unit: systemd must be PID 1 (what sd_booted() checks), not only installed.
if [ ! -d /run/systemd/system ]; then
  echo "systemd is not running as PID 1 here (PID 1 is $(cat /proc/1/comm 2>/dev/null || echo unknown)), and a detached job runs as a systemd unit: launch without --detach, or on nodes booted with systemd" >&2
  exit 3
fi
# The user flag for systemctl/systemd-run (job_user.sh), and the check that a user unit will outlive the login.
user_flag refuse
job=$1
cwd=$2
code=$3
shift 3
dir="$HOME/.local/state/clustercheck/jobs/$job"
mkdir -p "$dir"
if [ -n "$code" ]; then
  mkdir -p "$dir/code"
  tar xzf "$code" -C "$dir/code"
fi
case "$cwd" in
  "") cwd=$HOME ;;
  @code) cwd="$dir/code" ;;
  "~/"*) cwd="$HOME/${cwd#"~/"}" ;;
esac
date +%s > "$dir/started"
printf "%s\n" "$*" > "$dir/command"
: > "$dir/output.log"
# A unit that never started leaves no job behind.
systemd-run $uf --quiet --collect --unit="clustercheck-job-$job" \
  --description="clustercheck launch job $job" --working-directory="$cwd" \
  -p TimeoutStopSec=15 \
  -p "StandardOutput=append:$dir/output.log" -p "StandardError=append:$dir/output.log" \
  /bin/sh -c 'status=$1; shift; "$@"; echo $? > "$status"' sh "$dir/exit-status" "$@" \
  || { s=$?; rm -rf "$dir"; exit $s; }
