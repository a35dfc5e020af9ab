# A detached job that could not start on every node, discarded where it did (launcher/detached.py:
# discard_command), run as `sh -c` with argv: JOB: its unit stopped and its directory removed, so that
# `jobs --all` does not list a job that never ran.
# The user flag for systemctl (job_user.sh); a missing lingering is said, not refused, here.
user_flag
systemctl $uf stop "clustercheck-job-$1.service" 2>/dev/null || true
rm -rf "$HOME/.local/state/clustercheck/jobs"/"$1"
