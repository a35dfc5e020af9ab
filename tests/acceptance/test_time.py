"""base: chrony runs and is synchronised on every node."""

import time


def test_chrony_running_and_synchronised(host):
    assert host.service("chrony").is_running, "chronyd is not running"
    deadline = time.monotonic() + 60
    while True:  # a node that just came up needs a few polls to select its source
        tracking = host.run("chronyc -n tracking").stdout
        if "Leap status     : Normal" in tracking or time.monotonic() > deadline:
            break
        time.sleep(3)
    assert "Leap status     : Normal" in tracking, f"chrony is not synchronised:\n{tracking}"
