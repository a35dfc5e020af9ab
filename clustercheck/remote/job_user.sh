# The prelude of every detached-job script (launcher/detached.py puts it in front of each): user_flag sets $uf, the
# flag for systemctl and systemd-run (--user, a user unit, unless root), and says on stderr when the user has no
# lingering systemd user manager (a user unit would end at logout); with "refuse" it exits 3 (detached.REFUSED) then.
user_flag() {
  uf=""
  if [ "$(id -u)" != 0 ]; then
    uf=--user
    if [ "$(loginctl show-user "$(id -un)" -p Linger --value 2>/dev/null)" != yes ]; then
      echo "$(id -un) has no lingering systemd user manager, so a detached job would end at logout: run: sudo loginctl enable-linger $(id -un)" >&2
      [ "$1" != refuse ] || exit 3
    fi
  fi
}
