# The file systems a node-side program needs, read without Python (the first command runs it before any Python is
# known; a failed program's diagnosis runs it again): sh -c SCRIPT sh [CLASS=PATH ...]. Nothing is written. For /tmp,
# $TMPDIR, /dev/shm, the home and cache directories and each CLASS=PATH given, one line:
#   fs<TAB>CLASS<TAB>PATH<TAB>`stat -f -c '%S %b %f %a %c %d'` (block size, blocks, free, available to users,
#   inodes, free inodes)<TAB>its mount point (`stat -c %m`)<TAB>that mount's options (/proc/self/mounts)
# then the user's uid (uid<TAB>UID), each file in /dev/shm (shm<TAB>SIZE<TAB>OWNER'S UID<TAB>PATH) and each /dev/shm
# file a process holds open or maps (held<TAB>PATH; /proc/*/fd and /proc/*/maps, those this user can read: all of
# them for root). clustercheck/facts/filesystems.py parses it.
for a in "tmp=/tmp" "tmpdir=${TMPDIR:-}" "shm=/dev/shm" "home=${HOME:-}" "cache=${XDG_CACHE_HOME:-${HOME:+$HOME/.cache}}" "$@"; do
    c=${a%%=*}; p=${a#*=}
    [ -n "$p" ] || continue
    s=$(stat -f -c '%S %b %f %a %c %d' "$p" 2>/dev/null) || continue
    m=$(stat -c %m "$p" 2>/dev/null)
    o=$(awk -v m="$m" '$2 == m { o = $4 } END { print o }' /proc/self/mounts 2>/dev/null)
    printf 'fs\t%s\t%s\t%s\t%s\t%s\n' "$c" "$p" "$s" "$m" "$o"
done
printf 'uid\t%s\n' "$(id -u)"
find /dev/shm -maxdepth 1 -type f -printf 'shm\t%s\t%U\t%p\n' 2>/dev/null | head -n 1000
# Reading a process's maps takes its memory map's lock: a process stuck holding it (a page fault on a hung mount)
# would stop the reader, so both reads are bounded (the kernel lets a reader waiting for that lock be killed).
t=; command -v timeout >/dev/null && t="timeout -k 1 5"
$t find /proc/[0-9]*/fd -maxdepth 1 -lname '/dev/shm/*' -printf 'held\t%l\n' 2>/dev/null | sort -u
$t awk '$6 ~ /^\/dev\/shm\// { print "held\t" $6 }' /proc/[0-9]*/maps 2>/dev/null | sort -u
true
