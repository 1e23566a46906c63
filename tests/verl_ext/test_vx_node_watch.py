"""The node watch of the driver (verl_ext.node_watch): which nodes count as lost, what the message says about
the
checkpoints, the watch thread on a scripted node table, and the driver's exit. Node tables have the shape
``ray.nodes()`` returns (the fields read here, as a live Ray 2.60 reports them); the two-node run that loses a
real node is tests/verl_ext/cpu/test_cpu_cluster.py (``make test-cluster``)."""

from __future__ import annotations

import subprocess
import sys
import threading

from verl_ext.node_watch import EXIT_NODE_LOST, NodeWatch, checkpoint_state, lost_nodes, node_lost_message

HEALTH = "health check failed due to missing too many heartbeats"  # Ray's message for a killed raylet


def node(node_id: str, alive: bool, reason: int = 0, message: str = "") -> dict:
    return {
        "NodeID": node_id,
        "Alive": alive,
        "NodeManagerAddress": "10.0.0.7",
        "DeathReason": reason,
        "DeathReasonMessage": message,
    }


def test_a_node_seen_alive_then_dead_is_lost():
    seen: set[str] = set()
    assert lost_nodes(seen, [node("head", True), node("w1", True)]) == []
    assert seen == {"head", "w1"}
    dead = node("w1", False, reason=2, message=HEALTH)  # UNEXPECTED_TERMINATION
    assert lost_nodes(seen, [node("head", True), dead]) == [dead]


def test_nodes_dead_before_the_run_or_drained_idle_are_not_lost():
    seen: set[str] = set()
    # w0 died before the run started (never seen alive): an earlier run's node, nothing of this run on it
    assert lost_nodes(seen, [node("head", True), node("w0", False, reason=2)]) == []
    lost_nodes(seen, [node("head", True), node("w2", True)])
    # the autoscaler removed w2 because it was idle (AUTOSCALER_DRAIN_IDLE): it ran nothing of the run
    assert lost_nodes(seen, [node("head", True), node("w2", False, reason=4)]) == []
    # a preempted node (AUTOSCALER_DRAIN_PREEMPTED) counts
    lost_nodes(seen, [node("w3", True)])
    assert [n["NodeID"] for n in lost_nodes(seen, [node("w3", False, reason=3)])] == ["w3"]


def test_the_last_complete_checkpoint_is_the_trackers(tmp_path):
    assert checkpoint_state(tmp_path) == (None, [])  # nothing saved yet
    for step in (1, 2, 10):
        (tmp_path / f"global_step_{step}").mkdir()
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("1")
    # global_step_2 and global_step_10 were being written when the node went away (the tracker still says 1)
    assert checkpoint_state(tmp_path) == (
        tmp_path / "global_step_1",
        [tmp_path / "global_step_2", tmp_path / "global_step_10"],
    )
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("10\n")
    assert checkpoint_state(tmp_path) == (tmp_path / "global_step_10", [])


def test_the_message_names_the_node_the_reason_and_what_a_rerun_resumes(tmp_path):
    (tmp_path / "global_step_1").mkdir()
    (tmp_path / "global_step_2").mkdir()
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("1")
    message = node_lost_message([node("w1", False, 2, HEALTH)], tmp_path)
    assert message.splitlines() == [
        f"Ray lost a node of the run, which stops now: w1 (10.0.0.7): {HEALTH}",
        f"  last complete checkpoint: {tmp_path / 'global_step_1'}",
        f"  incomplete, not resumed from: {tmp_path / 'global_step_2'}",
        "  bring the node back (or replace it) and rerun the same command: trainer.resume_mode=auto resumes",
    ]
    empty = tmp_path / "fresh"
    two = node_lost_message([node("w1", False), node("w2", False)], empty)
    assert two.startswith("Ray lost 2 nodes of the run, which stops now: w1 (10.0.0.7): no reason; w2 (10.0.0.7)")
    assert f"no complete checkpoint in {empty}: a rerun starts from the beginning" in two


class ScriptedRay:
    """Answers ray.is_initialized / ray.nodes from a script: not initialized for the first `not_ready` looks, then
    the node tables in turn (the last one repeated)."""

    def __init__(self, tables: list[list[dict]], not_ready: int = 0) -> None:
        self.tables, self.not_ready, self.calls = tables, not_ready, 0

    def ready(self) -> bool:
        self.not_ready -= 1
        return self.not_ready < 0

    def nodes(self) -> list[dict]:
        self.calls += 1
        return self.tables[min(self.calls, len(self.tables)) - 1]


def test_the_watch_reports_a_lost_node_once(tmp_path):
    ray = ScriptedRay(
        [
            [node("head", True), node("w1", True)],
            [node("head", True), node("w1", True)],
            [node("head", True), node("w1", False, 2, HEALTH)],
        ],
        not_ready=3,
    )
    reports: list[str] = []
    reported = threading.Event()

    def on_lost(message: str) -> None:
        reports.append(message)
        reported.set()

    watch = NodeWatch(str(tmp_path), on_lost, poll_s=0.001, nodes=ray.nodes, ready=ray.ready).start()
    assert reported.wait(60)
    watch._thread.join(60)  # the thread ends after its report
    assert not watch._thread.is_alive()
    assert len(reports) == 1 and reports[0].startswith(
        f"Ray lost a node of the run, which stops now: w1 (10.0.0.7): {HEALTH}"
    )
    assert watch.lost.is_set() and watch.message == reports[0]
    assert ray.calls == 3  # no look at the node table before Ray was initialized
    assert watch.seen_alive == {"head", "w1"}


def test_a_stopped_watch_reports_nothing(tmp_path):
    ray = ScriptedRay([[node("head", True)]])
    watch = NodeWatch(str(tmp_path), lambda message: None, poll_s=0.001, nodes=ray.nodes, ready=ray.ready).start()
    watch.stop()
    watch._thread.join(60)
    assert not watch._thread.is_alive() and not watch.lost.is_set()


EXIT_FROM_A_BLOCKED_MAIN_THREAD = """
import threading
from verl_ext.node_watch import exit_on_node_lost

threading.Thread(target=exit_on_node_lost, args=("Ray lost a node of the run, which stops now: w1",)).start()
threading.Event().wait()  # the main thread blocks, as in ray.get on a call that never returns
"""


def test_the_driver_exits_with_the_message_even_with_its_main_thread_blocked():
    result = subprocess.run(
        [sys.executable, "-c", EXIT_FROM_A_BLOCKED_MAIN_THREAD], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == EXIT_NODE_LOST == 75
    assert result.stderr == "[memagent] Ray lost a node of the run, which stops now: w1\n"
