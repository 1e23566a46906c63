"""Checks of the running cluster (verl_ext.cluster): what Ray can schedule for the run, and the paths as the
task
runner's node sees them. Inputs are real: cluster-resource dicts as ``ray.cluster_resources()`` returns them, and
real files and folders under tmp_path."""

from __future__ import annotations

import socket

import pandas as pd
import pytest
from process_helpers import in_a_fresh_process
from vx_helpers import compose_config

from verl_ext.cluster import (
    check_task_runner_node,
    cluster_address,
    drop_local_ray_settings,
    other_nodes_problems,
    path_problems,
    resource_problems,
    secret_problems,
)
from verl_ext.preflight import PreflightError

# ray.cluster_resources() of one node with 8 GPUs and 96 CPUs (Ray also lists memory and node:<ip> keys).
EIGHT_GPU_NODE = {"CPU": 96.0, "GPU": 8.0, "memory": 1.2e12, "object_store_memory": 2e11, "node:10.0.0.1": 1.0}


def paper_7b(*overrides: str):
    return compose_config("memagent_7b", list(overrides))


def paper_7b_with_paths(train: object, val: object, model: object, out: object):
    """The 7B run with the four paths the node checks look at: data files, model folder, checkpoint folder."""
    return paper_7b(
        f"data.train_files={train}",
        f"data.val_files={val}",
        f"actor_rollout_ref.model.path={model}",
        f"trainer.default_local_dir={out}",
    )


def test_a_machine_without_gpus_is_refused_with_the_counts_and_the_cpu_run():
    problems = resource_problems({"CPU": 2.0, "memory": 8e9}, paper_7b())
    assert len(problems) == 2
    # 4 nodes x 8 GPUs = 32 (memagent_7b's defaults), Ray sees none.
    needs = "the run needs trainer.nnodes x trainer.n_gpus_per_node = 4 x 8 = 32"
    assert problems[0].startswith(f"Ray sees 0 GPU(s), {needs}")
    assert "bash scripts/train_tiny_cpu.sh" in problems[0]
    # 3 per GPU (96) + 8 storage actors + TransferQueue's controller + the task runner = 106; 2 would hang tq.init.
    assert problems[1].startswith("Ray sees 2 CPU(s), the run needs 106: 3 per GPU for verl's worker bundles (96), 8 ")


def test_one_node_of_the_four_the_config_asks_for():
    problems = resource_problems(EIGHT_GPU_NODE, paper_7b())
    assert len(problems) == 2
    assert problems[0].startswith("Ray sees 8 GPU(s), the run needs trainer.nnodes x trainer.n_gpus_per_node = 4 x 8")
    assert problems[1].startswith("Ray sees 96 CPU(s), the run needs 106")


@pytest.mark.parametrize(
    ("resources", "overrides"),
    [
        (EIGHT_GPU_NODE, ["trainer.nnodes=1"]),  # 1 x 8 = 8
        ({"CPU": 384.0, "GPU": 32.0}, []),  # 4 nodes' worth: 32 GPUs, 106 CPUs
        ({"CPU": 384.0, "GPU": 40.0}, []),  # more than needed is fine
    ],
)
def test_enough_gpus_and_cpus_pass(resources, overrides):
    assert resource_problems(resources, paper_7b(*overrides)) == []


def test_the_cpu_run_with_fake_ray_gpus_passes():
    # tiny_cpu: trainer.device=cpu, 1 x 2 fake GPUs (ray_init.num_gpus=2), 16 logical CPUs, 2 storage units.
    config = compose_config("tiny_cpu")
    assert resource_problems({"CPU": 16.0, "GPU": 2.0}, config) == []
    # 3 x 2 + 2 + 1 + 1 = 10
    assert resource_problems({"CPU": 9.0, "GPU": 2.0}, config) == [
        "Ray sees 9 CPU(s), the run needs 10: 3 per GPU for verl's worker bundles (6), 2 TransferQueue storage "
        "actors (transfer_queue.backend.SimpleStorage.num_data_storage_units), its controller and this task runner "
        "(1 each); give Ray more CPUs (ray_kwargs.ray_init.num_cpus) or lower num_data_storage_units"
    ]


def test_ascend_counts_npus():
    config = paper_7b("trainer.nnodes=1", "trainer.device=npu")
    assert resource_problems(EIGHT_GPU_NODE, config)[0].startswith("Ray sees 0 NPU(s)")
    assert resource_problems({"CPU": 96.0, "NPU": 8.0}, config) == []


def make_run_files(tmp_path):
    data = tmp_path / "train.parquet"
    pd.DataFrame([{"prompt": "q", "context": "c"}]).to_parquet(data)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    return data, model


def test_paths_seen_from_this_node(tmp_path):
    data, model = make_run_files(tmp_path)
    config = paper_7b_with_paths(data, data, model, f"{tmp_path}/runs/7B")
    assert path_problems(config) == []  # runs/7B does not exist yet, but tmp_path is writable

    missing = tmp_path / "elsewhere" / "dev.parquet"
    config = paper_7b_with_paths(
        data, f"[{missing},hdfs://cluster/dev.parquet]", tmp_path / "not-here", f"{data}/checkpoints"
    )
    assert path_problems(config) == [
        f"data.val_files: {missing} is not a readable file here",
        f"actor_rollout_ref.model.path: {tmp_path / 'not-here'} is not a model folder here (no config.json); the "
        "launching node resolved it, so it must be on storage every node reads at the same path",
        f"trainer.default_local_dir: {data}/checkpoints cannot be written here",  # under a file
    ]


def test_the_error_names_the_node_and_lists_everything(tmp_path):
    data, _ = make_run_files(tmp_path)
    config = paper_7b_with_paths(data, data, tmp_path / "missing-model", f"{tmp_path}/runs")
    with pytest.raises(PreflightError) as err:
        check_task_runner_node(config, resources={"CPU": 2.0})
    message = str(err.value)
    assert message.startswith(f"the run cannot start on node {socket.gethostname()}:\n  - Ray sees 0 GPU(s)")
    assert message.count("\n  - ") == 3  # GPUs, CPUs, the model folder
    assert "missing-model is not a model folder here" in message


@pytest.mark.parametrize(
    ("logger", "environ", "netrc", "refused"),
    [
        ("[console,wandb]", {}, None, True),
        ("[console,wandb]", {"WANDB_API_KEY": "k"}, None, False),
        ("[console,wandb]", {"WANDB_MODE": "offline"}, None, False),
        ("[console,wandb]", {}, "machine api.wandb.ai\n  login user\n  password k\n", False),  # `wandb login`
        ("[console,wandb]", {"WANDB_BASE_URL": "https://wandb.example.org"}, "machine api.wandb.ai\n", True),
        ("[console,file]", {}, None, False),
    ],
)
def test_wandb_needs_a_key_on_this_node(tmp_path, logger, environ, netrc, refused):
    if netrc is not None:
        (tmp_path / ".netrc").write_text(netrc)
    problems = secret_problems(paper_7b(f"trainer.logger={logger}"), environ, tmp_path)
    assert bool(problems) == refused
    if refused:
        assert "export WANDB_API_KEY before `ray start` on every node" in problems[0]


@pytest.mark.parametrize("name", ["memagent_7b", "memagent_14b", "tiny_cpu"])
def test_every_run_gives_its_ray_processes_tq_num_threads_1(name):
    """TQ_NUM_THREADS=1 on GPU runs as on CPU (docs/cluster.md), as the string Ray's runtime_env wants, and still
    there after verl merges its own runtime env under ours (what run_ppo passes to ray.init)."""
    from omegaconf import OmegaConf
    from verl.trainer.constants_ppo import get_ppo_ray_runtime_env

    config = compose_config(name, ["+ray_kwargs.ray_init.runtime_env.env_vars.WANDB_MODE=offline"])  # the launcher's
    merged = OmegaConf.merge(get_ppo_ray_runtime_env(config), config.ray_kwargs.ray_init.runtime_env)
    env_vars = OmegaConf.to_container(merged)["env_vars"]
    assert env_vars["TQ_NUM_THREADS"] == "1"
    assert env_vars["WANDB_MODE"] == "offline"
    assert env_vars["VERL_FULL_DETERMINISM"] == "0"  # verl's own entries are kept


def node_problems_on_a_local_ray(config) -> dict:
    """In a fresh process (process_helpers.in_a_fresh_process): a real local Ray of one node, and what the node
    check reports with no other node and with that node named."""
    import shutil
    import tempfile

    import ray

    ray_tmp = tempfile.mkdtemp(prefix="rc")  # Ray's Unix sockets need a short path
    ray.init(num_cpus=1, include_dashboard=False, _temp_dir=ray_tmp, log_to_driver=False)
    try:
        node = ray.get_runtime_context().get_node_id()
        return {
            "node": node,
            "unnamed": other_nodes_problems(config),
            # a bound for a loaded machine, not a timing under test: a Ray worker's start took over the check's
            # default 120 s with two suites on two cores
            "named": other_nodes_problems(config, node_ids=[node], timeout_s=600),
        }
    finally:
        ray.shutdown()
        shutil.rmtree(ray_tmp, ignore_errors=True)


def test_the_other_nodes_are_asked_by_a_task_pinned_to_each(tmp_path):
    """A real local Ray (one node): the node check runs as a 0-CPU task pinned to the given node, and its problems
    come back with that node's name; with no other node, nothing is asked."""
    data, _ = make_run_files(tmp_path)
    config = paper_7b_with_paths(data, data, tmp_path / "on-the-head-node-only", f"{tmp_path}/runs")
    seen = in_a_fresh_process(node_problems_on_a_local_ray, config)
    assert seen["unnamed"] == []  # this is the only node
    assert seen["named"] == [
        f"on node {socket.gethostname()} (Ray node {seen['node']}): actor_rollout_ref.model.path: "
        f"{tmp_path / 'on-the-head-node-only'} is not a model folder here (no config.json); the launching node "
        "resolved it, so it must be on storage every node reads at the same path"
    ]


@pytest.mark.parametrize(
    ("environ", "overrides", "joins"),
    [
        ({}, [], None),  # no address: the run starts its own Ray
        ({"RAY_ADDRESS": "local"}, [], None),  # Ray's word for the same
        ({"RAY_ADDRESS": "10.0.0.1:6379"}, [], "10.0.0.1:6379"),
        ({"RAY_ADDRESS": "auto"}, [], "auto"),  # the head node's running cluster (README)
        ({}, ["+ray_kwargs.ray_init.address=10.0.0.2:6379"], "10.0.0.2:6379"),
    ],
)
def test_joining_a_cluster_drops_the_size_of_a_local_ray(environ, overrides, joins):
    """ray.init refuses num_cpus / num_gpus when it joins a running cluster; the CPU config sets both for the Ray it
    starts on one machine (16 CPUs, 2 fake GPUs), so a cluster launch with the CPU config leaves them out."""
    config = compose_config("tiny_cpu", overrides)
    assert cluster_address(config, environ) == joins
    dropped = drop_local_ray_settings(config, environ)
    ray_init = config.ray_kwargs.ray_init
    if joins is None:
        assert dropped == [] and (ray_init.num_cpus, ray_init.num_gpus) == (16, 2)
    else:
        assert dropped == ["num_cpus", "num_gpus"]
        assert "num_cpus" not in ray_init and "num_gpus" not in ray_init
        assert ray_init.runtime_env.env_vars.VERL_PLATFORM == "cpu"  # the rest stays


def test_the_gpu_configs_leave_the_cluster_to_size_itself():
    config = paper_7b()
    assert config.ray_kwargs.ray_init.num_cpus is None  # verl's default: Ray counts the node
    assert drop_local_ray_settings(config, {"RAY_ADDRESS": "auto"}) == []
