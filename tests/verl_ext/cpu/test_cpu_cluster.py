"""The cluster route, run for real: a Ray cluster of two nodes on this machine, joined, trained on, a node lost,
resumed. The slower tier: ``make test-cluster`` (marker ``cluster``; ``make test`` and plain pytest leave it out).

``scripts/local_cluster.py`` starts a head and a worker node with ``ray start`` (each its own session, temp folder,
ports, one fake GPU and 8 logical CPUs) and waits until Ray's node table lists both alive. The run is what a user
types on a cluster's head node, with the CPU config in place of the 7B one and Ray's address in place of ``auto``:

    RAY_ADDRESS=<head> NNODES=2 NGPUS_PER_NODE=1 bash scripts/launch_memory.sh tiny_cpu ...

(the CPU platform's two variables exported, as for every CPU run). Where each piece of the run went is read back
from Ray's own state API (jobs, actors, tasks), not from our logs.

- two steps with validation and a checkpoint per step: the launcher joins the cluster, the task runner checks its
  node and a pinned task checks the other, the two FSDP ranks (one process group, world size 2) and the two
  rollout servers sit one on each node;
- the worker node's raylet killed (``kill -9``) as step 2 starts (the event: verl's metrics line of step 1, written
  just before step 2 begins): the run stops within a bound with exit status 75 and a message naming the lost node
  and the last complete checkpoint, nothing of step 2 is saved, none of the run's actors outlives it; a new worker
  node joins and the same command resumes from step 1's checkpoint and trains step 2 on the rows an uninterrupted
  run takes (file order: step k reads rows (k-1)*4 .. k*4-1).

Times are printed (``pytest -s``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from process_helpers import in_a_fresh_process, session_members
from trainer_run import read_jsonl, read_metrics, tail

REPO = Path(__file__).resolve().parents[3]
CLUSTER_SCRIPT = REPO / "scripts" / "local_cluster.py"
LAUNCHER = REPO / "scripts" / "launch_memory.sh"
BATCH = 4  # data.train_batch_size of configs/tiny_cpu.yaml
RUN_TIMEOUT_S = 1200  # a launch: ~2 min on 2 idle cores, ~6 min with the machine's load average at 14
# Ray declares a killed raylet's node dead after ~15 s of missed health checks; the watch polls every 2 s, and a
# driver that got an error first waits for it (verl_ext/node_watch.py). A loaded machine delays both.
STOP_BOUND_S = 120
NODE_LOST_EXIT = 75
TWO_RANKS = ["model_world_size_2_rank_0.pt", "model_world_size_2_rank_1.pt"]  # one FSDP group over both nodes

pytestmark = [pytest.mark.cluster, pytest.mark.slow(seconds=900), pytest.mark.timeout(3600)]


def local_cluster(*args: object, timeout_s: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(CLUSTER_SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=timeout_s
    )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A head and a worker node, up (Ray's node table lists both alive) until the module's tests are done; then
    stopped, whatever the tests did: every process of both nodes' sessions gone, their temp folders removed."""
    state = tmp_path_factory.mktemp("cluster") / "cluster.json"
    start = time.monotonic()
    started = local_cluster("start", "--state", state)
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        info = json.loads(state.read_text())
        info["state"] = state
        print(f"\n[cluster] two nodes up in {time.monotonic() - start:.0f} s:\n{started.stdout}")
        assert f"RAY_ADDRESS={info['address']}" in started.stdout
        assert [node["name"] for node in info["nodes"]] == ["head", "worker-1"]
        assert all(len(node["node_id"]) == 56 for node in info["nodes"])  # Ray's hex node ids
        yield info
    finally:
        if state.exists():
            nodes = json.loads(state.read_text())["nodes"]
            stopped = local_cluster("stop", "--state", state)
            assert stopped.returncode == 0, stopped.stdout + stopped.stderr
            assert not state.exists()
            for node in nodes:
                assert session_members(node["session"]) == [], f"processes of {node['name']} left behind"
                assert not Path(node["temp_dir"]).exists()


@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> Path:
    """The launcher's data layout (DATASET_ROOT/hotpotqa/...) holding the tiny memory task: 16 training questions
    (four steps' worth, read in file order), 4 to validate."""
    from experiments.tiny.data import write

    root = tmp_path_factory.mktemp("data")
    files = write(root / "generated", train=16, val=4, task="memory")
    (root / "hotpotqa").mkdir()
    shutil.copy(files["train"], root / "hotpotqa" / "hotpotqa_train_32k.parquet")
    shutil.copy(files["dev"], root / "hotpotqa" / "hotpotqa_dev.parquet")
    return root


class Launch:
    """The user's cluster command in its own session, its output in a log file."""

    def __init__(self, cluster: dict, run_dir: Path, data_root: Path, model: str, log: Path) -> None:
        env = {
            **os.environ,
            "RAY_ADDRESS": cluster["address"],
            "NNODES": "2",
            "NGPUS_PER_NODE": "1",
            "MODEL_PATH": model,
            "DATASET_ROOT": str(data_root),
            "PROJ_ROOT": str(run_dir / "runs"),
            "LOGGER": "console,file",
            "DUMP_ROLLOUTS": "1",
            "PYTHON": sys.executable,
            # the CPU platform in the driver (verl_ext/cpu/README.md); the config carries it to every Ray
            # worker
            "VERL_PLATFORM": "cpu",
            "VERL_USE_EXTERNAL_MODULES": "verl_ext.cpu.load",
            "RAY_AUTH_MODE": "disabled",  # as scripts/local_cluster.py started the nodes
            "PYTHONUNBUFFERED": "1",
        }
        # verl's file logger runs in the task runner, on whichever node Ray placed it: the path goes in the config
        metrics = f"+ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH={run_dir / 'metrics.jsonl'}"
        self.log = log
        self.started = time.monotonic()
        with open(log, "w") as out:
            self.process = subprocess.Popen(
                ["bash", str(LAUNCHER), "tiny_cpu", "tiny", "2", metrics],
                env=env,
                cwd=run_dir,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def wait(self, timeout_s: float) -> int:
        try:
            return self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.end()
            pytest.fail(f"the launch did not end within {timeout_s:.0f} s:\n{tail(self.output())}")

    def end(self) -> None:
        for pid in session_members(self.process.pid):
            os.kill(pid, 9)
        self.process.wait()

    def output(self) -> str:
        return self.log.read_text()

    def left_behind(self) -> list[int]:
        """Processes of the launch's session still alive (the driver's exit ends them within seconds)."""
        deadline = time.monotonic() + 30
        while session_members(self.process.pid) and time.monotonic() < deadline:
            time.sleep(0.5)
        return session_members(self.process.pid)


def the_runs_ray_state(address: str, run_dir: str) -> list[dict]:
    """Ray's state API, in a fresh process: the driver jobs launched for ``run_dir`` (its path is in the command
    line), in launch order, each with where its actors and its path-check tasks ran."""
    from ray.util.state import list_actors, list_jobs, list_tasks

    jobs = sorted(
        (job for job in list_jobs(address=address) if job.entrypoint and run_dir in job.entrypoint),
        key=lambda job: job.job_id,
    )
    runs = []
    for job in jobs:
        actors = list_actors(address=address, filters=[("job_id", "=", job.job_id)], limit=10_000, detail=True)
        tasks = list_tasks(address=address, filters=[("job_id", "=", job.job_id)], limit=10_000)
        runs.append(
            {
                "job_id": job.job_id,
                "actors": [
                    {"class": a.class_name.rsplit(".", 1)[-1], "name": a.name, "node": a.node_id, "state": a.state}
                    for a in actors
                ],
                "node_checks": [{"node": t.node_id, "state": t.state} for t in tasks if t.name == "_node_report"],
            }
        )
    return runs


def nodes_of(run: dict, cls: str) -> list[str]:
    return sorted(actor["node"] for actor in run["actors"] if actor["class"] == cls)


def steps_trained(output: str) -> list[int]:
    return [int(step) for step in re.findall(r"\[recurrent\] step (\d+):", output)]


def questions_of_step(run_dir: Path, step: int) -> set[tuple[str, str]]:
    """(question, answer) of each prompt of a training step, from the rollout dump's final-answer rows."""
    rows = read_jsonl(run_dir / "runs" / "memory_agent" / "TINY_CPU" / "rollouts" / f"{step}.jsonl")
    final = [row for row in rows if row["turn_kind"] == "final"]
    return {(re.search(r"<problem> \n(.*)\n</problem>", r["input"]).group(1), str(r["gts"])) for r in final}


def questions_of_rows(data_root: Path, first: int, count: int) -> set[tuple[str, str]]:
    import pandas as pd

    train = pd.read_parquet(data_root / "hotpotqa" / "hotpotqa_train_32k.parquet")
    return {
        (train.prompt[i][0]["content"], str(train.reward_model[i]["ground_truth"])) for i in range(first, first + count)
    }


def checkpoint_ranks(folder: Path) -> list[str]:
    return sorted(path.name for path in (folder / "actor").glob("model_world_size_*_rank_*.pt"))


def test_two_steps_on_two_nodes_through_the_cluster_command(cluster, data_root, tiny_model_dir, tmp_path):
    head, worker = (node["node_id"] for node in cluster["nodes"])
    launch = Launch(cluster, tmp_path, data_root, tiny_model_dir, tmp_path / "launch.log")
    rc = launch.wait(RUN_TIMEOUT_S)
    wall = time.monotonic() - launch.started
    output = launch.output()
    assert rc == 0, tail(output)
    assert launch.left_behind() == []
    assert f"[memagent] Ray cluster {cluster['address']}, 2 node(s) x 1 GPU(s)" in output
    # the CPU config sizes a Ray of its own; joining, the launcher leaves that to the cluster's `ray start`
    assert f"[memagent] joining the Ray cluster at {cluster['address']}: ray_kwargs.ray_init.num_cpus," in output
    assert steps_trained(output) == [1, 2]

    run_dir = tmp_path / "runs" / "memory_agent" / "TINY_CPU"
    metrics = read_metrics(tmp_path / "metrics.jsonl")
    assert sorted(metrics) == [0, 1, 2]  # validation before training, then steps 1 and 2 (each validated)
    for step in (0, 1, 2):
        assert 0.0 <= metrics[step]["val-core/toy_memory/acc/mean@2"] <= 1.0
    for step in (1, 2):
        assert metrics[step]["actor/grad_norm"] > 0 and "timing_s/step" in metrics[step]
        assert checkpoint_ranks(run_dir / f"global_step_{step}") == TWO_RANKS  # each rank wrote its shard
        assert questions_of_step(tmp_path, step) == questions_of_rows(data_root, (step - 1) * BATCH, BATCH)
    assert (run_dir / "latest_checkpointed_iteration.txt").read_text().strip() == "2"

    # Where each piece ran, as Ray recorded it.
    (run,) = in_a_fresh_process(the_runs_ray_state, cluster["address"], str(tmp_path))
    print(f"\n[cluster] two steps on two nodes: wall {wall:.0f} s; actors: {run['actors']}")
    assert nodes_of(run, "WorkerDict") == sorted([head, worker])  # the two FSDP ranks (actor and reference)
    assert nodes_of(run, "HFCPUServer") == sorted([head, worker])  # a rollout server beside each rank
    (runner,) = nodes_of(run, "RecurrentTaskRunner")
    checked_elsewhere = [check["node"] for check in run["node_checks"]]
    assert [check["state"] for check in run["node_checks"]] == ["FINISHED"]
    # the task runner checked its own node; a task pinned to the other node checked the paths there
    assert sorted([runner, *checked_elsewhere]) == sorted([head, worker])


def test_a_node_lost_mid_run_stops_the_run_and_the_same_command_resumes(cluster, data_root, tiny_model_dir, tmp_path):
    state = cluster["state"]
    head, lost = (node["node_id"] for node in cluster["nodes"][:2])
    run_dir = tmp_path / "runs" / "memory_agent" / "TINY_CPU"
    launch = Launch(cluster, tmp_path, data_root, tiny_model_dir, tmp_path / "launch.log")

    # The event: verl logs step 1's metrics as the last thing before step 2 begins.
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while launch.process.poll() is None and time.monotonic() < deadline:
        if (tmp_path / "metrics.jsonl").is_file() and 1 in read_metrics(tmp_path / "metrics.jsonl"):
            break
        time.sleep(0.5)
    assert launch.process.poll() is None, "the run ended before step 2:\n" + tail(launch.output())
    until_step_2 = time.monotonic() - launch.started
    killed = local_cluster("kill-node", "--state", state, "--node", "worker-1")
    assert killed.returncode == 0, killed.stderr
    kill_time = time.monotonic()

    rc = launch.wait(STOP_BOUND_S)
    stop_s = time.monotonic() - kill_time
    print(f"\n[cluster] node lost: killed {until_step_2:.0f} s into the launch, the run stopped {stop_s:.1f} s later")
    output = launch.output()
    assert rc == NODE_LOST_EXIT, tail(output)
    assert launch.left_behind() == []
    assert f"[memagent] Ray lost a node of the run, which stops now: {lost} (" in output
    assert f"  last complete checkpoint: {run_dir / 'global_step_1'}\n" in output
    assert "rerun the same command: trainer.resume_mode=auto resumes" in output
    # nothing of step 2 counts as done: no metrics, no dump, the checkpoint tracker still at step 1
    assert sorted(read_metrics(tmp_path / "metrics.jsonl")) == [0, 1]
    assert not (run_dir / "rollouts" / "2.jsonl").exists()
    assert (run_dir / "latest_checkpointed_iteration.txt").read_text().strip() == "1"
    # and the surviving node holds nothing of the run: Ray ended the job's actors with its driver
    deadline = time.monotonic() + STOP_BOUND_S
    while True:
        (run,) = in_a_fresh_process(the_runs_ray_state, cluster["address"], str(tmp_path))
        alive = [actor for actor in run["actors"] if actor["state"] != "DEAD"]
        if not alive or time.monotonic() > deadline:
            break
    assert alive == [], alive

    # A node takes the lost one's place; the same command resumes.
    added = local_cluster("add-node", "--state", state)
    assert added.returncode == 0, added.stderr
    replacement = json.loads(Path(state).read_text())["nodes"][-1]
    assert replacement["name"] == "worker-2" and replacement["node_id"] not in (head, lost)
    (tmp_path / "metrics.1.jsonl").write_bytes((tmp_path / "metrics.jsonl").read_bytes())  # verl truncates it
    rerun = Launch(cluster, tmp_path, data_root, tiny_model_dir, tmp_path / "rerun.log")
    rc = rerun.wait(RUN_TIMEOUT_S)
    resume_s = time.monotonic() - rerun.started
    print(f"[cluster] the rerun on head + worker-2: wall {resume_s:.0f} s")
    output = rerun.output()
    assert rc == 0, tail(output)
    assert f"Resuming from {run_dir / 'global_step_1'}, setting global step to 1" in output
    assert steps_trained(output) == [2]
    assert sorted(read_metrics(tmp_path / "metrics.jsonl")) == [1, 2]  # validation at the resumed step, step 2
    assert (run_dir / "latest_checkpointed_iteration.txt").read_text().strip() == "2"
    assert checkpoint_ranks(run_dir / "global_step_2") == TWO_RANKS
    # the data order of an uninterrupted run: step 2 takes rows 4-7 (a fresh data loader would take rows 0-3)
    assert questions_of_step(tmp_path, 2) == questions_of_rows(data_root, BATCH, BATCH)
    assert questions_of_step(tmp_path, 1) == questions_of_rows(data_root, 0, BATCH)  # the first launch's dump
    _, resumed = in_a_fresh_process(the_runs_ray_state, cluster["address"], str(tmp_path))
    assert nodes_of(resumed, "WorkerDict") == sorted([head, replacement["node_id"]])
