"""The progress watchdog's judgement, fed polls as torchjob.py feeds it (rank -> heartbeat with its age)."""

from __future__ import annotations

from wording import says

from clustercheck.stages.watchdog import Watchdog

NODES = {name: "its SSH connection" for name in ("node1", "node2", "node3")}  # name -> its channel


def beat(step: int, age: float = 0.5, phase: str = "ddp") -> dict:
    return {"0": {"step": step, "phase": phase, "age": age}}


def run_polls(dog: Watchdog, start: float, end: float, answers) -> None:
    """Poll every node every 5 s from START to END; ANSWERS(node, t) gives its answer."""
    t = start
    while t <= end:
        for node in NODES:
            dog.observe(node, answers(node, t), t)
        t += 5


def test_a_node_that_stops_answering_while_the_others_wait_is_named_alone():
    dog = Watchdog(NODES, stall_timeout=20, now=0)

    def answers(node, t):
        if node == "node2" and t >= 30:  # frozen at t=30: no answer at all (a paused machine)
            return None
        step = min(int(t), 30)  # the others advance to step 30, then wait in the next collective
        return beat(step)

    run_polls(dog, 0, 40, answers)
    assert dog.stall(40) is None  # last seen at the poll of t=25: not yet
    run_polls(dog, 45, 45, answers)
    stall = dog.stall(45)
    assert stall is not None and stall.nodes == ("node2",)
    assert "node node2 stopped making progress at step 25 (ddp) (last seen 20 s ago)" in stall.message
    assert "its SSH connection does not answer" in stall.message
    assert "the other nodes (node1, node3) were waiting for it" in stall.message
    assert stall.data["progress"]["node1"]["ssh_answers"] is True


def test_a_node_whose_ranks_are_stopped_but_whose_ssh_answers_says_so():
    dog = Watchdog(NODES, stall_timeout=20, now=0)
    # node3's rank is stopped at step 7: its heartbeat file ages on the node's clock, SSH still answers.
    run_polls(dog, 0, 60, lambda n, t: beat(7, age=t - 7) if n == "node3" and t > 7 else beat(min(int(t), 8)))
    stall = dog.stall(60)
    assert stall.nodes == ("node3",)
    assert "its SSH connection answers" in stall.message


def test_a_job_that_keeps_stepping_is_never_a_stall():
    dog = Watchdog(NODES, stall_timeout=20, now=0)
    run_polls(dog, 0, 300, lambda n, t: beat(int(t)))
    assert dog.stall(300) is None


def test_slow_start_before_any_heartbeat_is_not_a_stall_while_nothing_is_known():
    dog = Watchdog(NODES, stall_timeout=20, now=0)
    run_polls(dog, 0, 15, lambda n, t: {})  # torchrun starting: no heartbeat file yet
    assert dog.stall(15) is None


def test_a_hang_where_every_rank_is_alive_names_the_node_behind():
    dog = Watchdog(NODES, stall_timeout=20, now=0)
    run_polls(dog, 0, 60, lambda n, t: beat(min(int(t), 4 if n == "node1" else 5)))
    stall = dog.stall(60)
    assert stall.nodes == ("node1",)
    assert "node node1 stopped at step 4 while the others reached a later step" in stall.message


def test_in_a_job_of_several_parts_a_later_part_is_ahead_of_any_step_of_an_earlier_one():
    """The run's torch job: node1 hangs at step 9 of its collectives part (part 2) while node2 and node3 moved on to
    step 1 of the DDP part (part 3) and wait for it there. node1 is behind, though its step number is higher."""
    dog = Watchdog(NODES, stall_timeout=20, now=0)

    def answers(node, t):
        if node == "node1":
            return {"0": {"part": 2, "step": min(int(t), 9), "phase": "collectives: all_reduce sweep", "age": 0.5}}
        if t < 10:
            return {"0": {"part": 2, "step": int(t), "phase": "collectives: all_reduce sweep", "age": 0.5}}
        return {"0": {"part": 3, "step": 1, "phase": "ddp: reference", "age": 0.5}}

    run_polls(dog, 0, 60, answers)
    stall = dog.stall(60)
    assert stall.nodes == ("node1",)
    assert "node node1 stopped at step 9 while the others reached a later step" in stall.message
    assert stall.data["progress"]["node1"]["part"] == 2 and stall.data["progress"]["node2"]["part"] == 3


def test_a_rank_importing_lightning_in_its_part_is_starting_while_it_uses_cpu():
    """A part's own start (Lightning's import in the torch job: "lightning: starting") is progress while the rank
    uses CPU, as the job's start is: not a hang however long it takes; once it stops using CPU, it is one."""
    dog = Watchdog({"node1": "its SSH connection"}, stall_timeout=20, now=0)
    for t in range(0, 65, 5):
        cpu = min(t, 40) * 0.5  # it works until t=40, then waits
        dog.observe("node1", {"0": {"part": 4, "step": 0, "phase": "lightning: starting", "cpu": cpu, "age": 0.5}}, t)
    assert dog.stall(40) is None
    assert dog.stall(65) is not None and "at step 0 (lightning: starting)" in dog.stall(65).message


def test_a_hang_at_the_same_step_everywhere_names_no_node():
    dog = Watchdog(NODES, stall_timeout=20, now=0)
    run_polls(dog, 0, 60, lambda n, t: beat(min(int(t), 5), phase="allreduce"))
    stall = dog.stall(60)
    assert stall.nodes == ()
    assert "every node waits at step 5 (allreduce), a hang no single node explains" in stall.message


def test_a_node_whose_job_ended_is_not_a_straggler():
    dog = Watchdog(NODES, stall_timeout=20, now=0)
    run_polls(dog, 0, 10, lambda n, t: beat(int(t)))
    for t in range(15, 60, 5):  # node1's torchrun ended at t=10: its heartbeats age, the others still step
        dog.ended("node1", t)
        dog.observe("node2", beat(t), t)
        dog.observe("node3", beat(t), t)
    assert dog.stall(60) is None


def test_a_node_whose_poll_hangs_does_not_answer_even_if_its_last_poll_was_recent():
    dog = Watchdog(NODES, stall_timeout=20, now=0)
    run_polls(dog, 0, 5, lambda n, t: beat(int(t)))
    dog.polling("node2", 6)  # frozen at 6: this poll never answers
    run_polls(dog, 10, 25, lambda n, t: None if n == "node2" else beat(int(t)))  # (node2's observations: none)
    dog.nodes["node2"].polling_since = 6  # still under way
    stall = dog.stall(26)
    assert stall.nodes == ("node2",) and "its SSH connection does not answer" in stall.message


def test_a_node_that_stops_answering_before_its_ranks_beat_is_named_within_the_stall_timeout():
    """node2 freezes while torchrun starts (at t=7): no node's ranks beat yet (the others wait for it in the
    rendezvous), so only its silence tells; it is named once it has not answered for the stall timeout."""
    dog = Watchdog(NODES, stall_timeout=20, now=0)
    run_polls(dog, 0, 25, lambda n, t: None if n == "node2" and t >= 7 else {})
    assert dog.stall(25) is None  # last answered at the poll of t=5: 20 s ago, not more
    run_polls(dog, 30, 30, lambda n, t: None if n == "node2" else {})
    stall = dog.stall(30)
    assert stall is not None and stall.nodes == ("node2",)
    assert says(stall.message, "node node2 stopped", "before its ranks reported any step", "no answer for 25 s")
    assert says(stall.message, "SSH connection does not answer", "other nodes (node1, node3) were waiting")
    assert stall.data["progress"]["node2"]["ssh_silent_s"] == 25
    assert stall.data["progress"]["node1"]["ssh_silent_s"] == 0


def test_a_node_still_starting_but_answering_is_never_blamed_while_the_others_wait():
    """Every node answers and no rank beats for a minute (a slow torch import on a busy machine): nobody is named;
    the job's own deadline (--timeout) decides."""
    dog = Watchdog(NODES, stall_timeout=20, now=0)
    run_polls(dog, 0, 60, lambda n, t: {})
    assert dog.stall(60) is None


def test_every_node_silent_alike_names_no_node():
    """The control machine lost the cluster network: no node answers, none is singled out."""
    dog = Watchdog(NODES, stall_timeout=20, now=0)
    run_polls(dog, 0, 5, lambda n, t: {})
    run_polls(dog, 10, 60, lambda n, t: None)
    assert dog.stall(60) is None


ALONE = {"node2": "its SSH connection"}  # the core stage's node-local job: one node


def test_the_only_node_of_a_job_that_stops_answering_is_named_not_called_a_hang():
    """node2's node-local job: its ranks at step 0 (starting) when its SSH stops answering, 25 s in. No other node
    is in the job, so the stall can only be node2's: it is named as the multi-node stages name a frozen node."""
    dog = Watchdog(ALONE, stall_timeout=60, now=0)
    for t in range(5, 70, 5):
        dog.observe("node2", beat(0, phase="starting") if t < 25 else None, t)
        assert dog.stall(t) is None, t  # no progress for 60 s yet, nor silent for 60 s
    dog.observe("node2", None, 70)
    stall = dog.stall(70)
    assert stall is not None and stall.nodes == ("node2",)
    assert says(stall.message, "node node2 stopped", "step 0 (starting)", "last seen 50 s ago")
    assert says(stall.message, "SSH connection does not answer")
    assert stall.data["stalled_nodes"] == ["node2"] and stall.data["progress"]["node2"]["ssh_answers"] is False


def test_the_only_node_silent_before_its_ranks_beat_is_named_and_one_answering_while_starting_is_not():
    silent = Watchdog(ALONE, stall_timeout=20, now=0)
    run_alone = [(t, {} if t < 7 else None) for t in range(0, 35, 5)]
    for t, answer in run_alone:
        silent.observe("node2", answer, t)
    stall = silent.stall(30)
    assert says(stall.message, "node node2 stopped", "before its ranks reported any step", "no answer for 25 s")
    assert says(stall.message, "SSH connection does not answer") and "waiting" not in stall.message
    starting = Watchdog(ALONE, stall_timeout=20, now=0)
    for t in range(0, 65, 5):
        starting.observe("node2", {}, t)  # it answers; no rank beats yet (a slow torch import): the deadline decides
    assert starting.stall(60) is None


def test_the_only_node_whose_ranks_wait_while_it_answers_is_named_with_its_step():
    dog = Watchdog(ALONE, stall_timeout=20, now=0)
    for t in range(0, 65, 5):
        dog.observe("node2", beat(min(t, 5), phase="allreduce"), t)
    stall = dog.stall(60)
    assert stall.nodes == ("node2",)
    assert says(stall.message, "node node2 stopped", "step 5 (allreduce)", "no progress for 55 s")
    assert says(stall.message, "SSH connection answers")


def starting(cpu: float, age: float = 0.5) -> dict:
    """One rank still starting (step 0), having used CPU seconds of CPU."""
    return {"0": {"step": 0, "phase": "starting", "age": age, "cpu": cpu}}


def test_a_rank_still_importing_its_libraries_works_and_is_not_a_stall_however_long_it_takes():
    # A busy machine or a shared file system: importing torch and Lightning takes minutes, the rank using CPU all along
    # (a tenth of a CPU here); the same start on three nodes is no hang either.
    alone = Watchdog(ALONE, stall_timeout=20, now=0)
    for t in range(0, 185, 5):
        alone.observe("node2", starting(cpu=t * 0.1), t)
    assert alone.stall(180) is None
    dog = Watchdog(NODES, stall_timeout=20, now=0)
    run_polls(dog, 0, 180, lambda n, t: starting(cpu=t * 0.1))
    assert dog.stall(180) is None


def test_a_rank_that_waits_while_starting_is_named_once_it_uses_no_cpu():
    # Its libraries imported (CPU used up to t=10), the rank then waits (a rendezvous nobody answers): idle CPU.
    dog = Watchdog(ALONE, stall_timeout=20, now=0)
    for t in range(0, 65, 5):
        dog.observe("node2", starting(cpu=min(t, 10) * 0.5 + t * 0.001), t)
    stall = dog.stall(60)
    assert stall is not None and stall.nodes == ("node2",)
    assert says(stall.message, "node node2 stopped", "step 0 (starting)", "no progress for 50 s")
    assert says(stall.message, "SSH connection answers")
    hang = Watchdog(NODES, stall_timeout=20, now=0)
    run_polls(hang, 0, 60, lambda n, t: starting(cpu=min(t, 10) * 0.5))
    assert "every node waits at step 0 (starting), a hang no single node explains" in hang.stall(60).message


def test_a_rank_past_its_start_that_burns_cpu_while_it_waits_is_still_named():
    # Waiting in a collective can spin (NCCL): CPU counts as progress only while a rank is starting.
    dog = Watchdog(ALONE, stall_timeout=20, now=0)
    for t in range(0, 65, 5):
        dog.observe("node2", {"0": {"step": min(t, 5), "phase": "allreduce", "age": 0.5, "cpu": t * 1.0}}, t)
    stall = dog.stall(60)
    assert stall is not None and "at step 5 (allreduce) (no progress for 55 s)" in stall.message


def test_a_rank_that_works_on_after_the_others_ended_is_progress():
    # One node, two ranks: rank 1 ended after its 12 steps (its heartbeat file stays, ageing); rank 0 waits for the
    # single-process reference it started, which works: its phase moves on. No stall, however long the reference.
    dog = Watchdog(ALONE, stall_timeout=20, now=0)
    for t in range(0, 125, 5):
        ended = {"step": 12, "phase": "lightning fit", "age": t + 0.5}
        working = {"step": 12, "phase": f"the single-process reference: {t} s of CPU", "age": 0.5}
        dog.observe("node2", {"0": working, "1": ended}, t)
    assert dog.stall(120) is None


def test_a_node_is_known_silent_only_once_a_poll_came_back_empty_or_waited_too_long():
    """What a failed job's runner leaves alone (neither stopped nor waited for): not a node whose first poll has not
    come back yet, which is stopped and asked for its records like the others."""
    dog = Watchdog({"node1": "ssh", "node2": "ssh"}, stall_timeout=60, now=0)
    node1 = dog.nodes["node1"]
    assert not node1.silent(3)  # no poll yet
    dog.polling("node1", 5)
    assert not node1.silent(5.3)  # its first poll is under way
    assert node1.silent(5 + 8.5)  # under way for longer than PENDING
    dog.observe("node1", None, 14)
    assert node1.silent(14.1)  # it came back without an answer
    dog.observe("node1", {}, 20)
    assert not node1.silent(21) and node1.silent(20 + 16)  # answered, then nothing for longer than ANSWERING
