"""scripts/local_cluster.py without Ray: bad usage refused with exit status 2 before anything starts, the state file,
and stopping a node by its session (real processes). The script with real Ray nodes is the cluster tier
(tests/verl_ext/cpu/test_cpu_cluster.py, ``make test-cluster``)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from process_helpers import SCRIPTS, load_script, session_members

SCRIPT = SCRIPTS / "local_cluster.py"
local_cluster = load_script("local_cluster")


def run(*args: object) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=120)


def a_state_file(tmp_path: Path, nodes: list[dict]) -> Path:
    state = tmp_path / "cluster.json"
    state.write_text(json.dumps({"address": "10.0.0.1:6379", "nodes": nodes}))
    return state


def test_bad_usage_is_refused_before_anything_starts(tmp_path):
    missing = tmp_path / "none.json"
    result = run("stop", "--state", missing)
    assert (result.returncode, result.stderr) == (
        2,
        f"[local_cluster] {missing}: no such state file (nothing started with it, or already stopped)\n",
    )
    state = a_state_file(tmp_path, [])
    result = run("start", "--state", state)
    assert result.returncode == 2
    assert "exists: a cluster may be running (stop it first, or choose another --state)" in result.stderr
    result = run("start", "--state", tmp_path / "new.json", "--cpus-per-node", "0")
    assert result.returncode == 2 and "--cpus-per-node >= 1" in result.stderr
    assert not (tmp_path / "new.json").exists()
    (tmp_path / "broken.json").write_text("{not json")
    result = run("status", "--state", tmp_path / "broken.json")
    assert result.returncode == 2 and "not a state file of scripts/local_cluster.py" in result.stderr


def test_kill_node_refuses_the_head_and_an_unknown_or_dead_node(tmp_path):
    head = {"name": "head", "temp_dir": str(tmp_path / "h"), "session": 2**22 + 1, "node_id": "h"}
    worker = {"name": "worker-1", "temp_dir": str(tmp_path / "w"), "session": 2**22 + 2, "node_id": "w"}
    state = a_state_file(tmp_path, [head, worker])
    result = run("kill-node", "--state", state, "--node", "head")
    assert result.returncode == 2 and "kill a worker node; the head holds the cluster's control store" in result.stderr
    result = run("kill-node", "--state", state, "--node", "worker-7")
    assert result.returncode == 2 and "no node 'worker-7'; nodes: head, worker-1" in result.stderr
    result = run("kill-node", "--state", state, "--node", "worker-1")  # no process in that session
    assert result.returncode == 2 and "node worker-1 has no raylet running (lost already?)" in result.stderr


def test_the_state_file_round_trips(tmp_path):
    cluster = local_cluster.Cluster(address="10.0.0.1:6379", gpus_per_node=2)
    cluster.nodes.append(local_cluster.Node(name="head", temp_dir="/t/h", session=42, node_id="abc"))
    cluster.save(tmp_path / "c.json")
    assert local_cluster.Cluster.load(tmp_path / "c.json") == cluster
    assert not (tmp_path / "c.json.tmp").exists()


@pytest.mark.parametrize("ignores_term", [False, True])
def test_a_node_is_stopped_by_its_session(tmp_path, ignores_term):
    """Every process of the node's session ends (one that ignores SIGTERM by SIGKILL after the grace) and its temp
    folder goes; a process of another session is left alone."""
    trap = "trap '' TERM; " if ignores_term else ""
    node_process = subprocess.Popen(
        ["bash", "-c", f"{trap}sleep 600 & sleep 600 & wait"], start_new_session=True, stdout=subprocess.DEVNULL
    )
    bystander = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while len(local_cluster.session_pids(node_process.pid)) < 3:  # bash and its two sleeps
            assert time.monotonic() < deadline, "the node's processes did not start"
        temp_dir = tmp_path / "node"
        temp_dir.mkdir()
        node = local_cluster.Node(name="worker-1", temp_dir=str(temp_dir), session=node_process.pid)
        local_cluster.stop_node(node, grace_s=0.5)
        node_process.wait(timeout=60)
        assert session_members(node_process.pid) == []
        assert not temp_dir.exists()
        assert bystander.poll() is None  # another session's process
    finally:
        bystander.kill()
        bystander.wait()
