"""Checks that need the running Ray cluster: what Ray can schedule, and what the nodes can read.

:mod:`verl_ext.preflight` runs on the launching node before Ray starts. Some things can only be checked once
Ray is up, from inside the task runner (which Ray may place on any node of a cluster):

- **resources**: verl asks Ray for ``trainer.nnodes x trainer.n_gpus_per_node`` GPUs (with 3 CPUs each), and
  TransferQueue starts a controller and ``num_data_storage_units`` storage actors of 1 Ray CPU each. Ray
  queues an actor it cannot place and waits, without a message, for a node that may never come: a run on a
  machine without GPUs (or with too few CPUs) hangs in TransferQueue's start-up. We refuse instead, saying
  what Ray sees and what the run needs (docs/cluster.md).
- **paths**: the data files and the model folder were checked and resolved on the launching node; on a
  cluster they must be readable on every node too (shared storage), and the checkpoint folder writable.
- **secrets**: wandb runs in the task runner; on a cluster its key comes from this node's environment
  (docs/cluster.md: the launcher forwards no secret through the config).

:func:`check_task_runner_node` runs them before anything is started (the paths also on the cluster's other
nodes, by a 0-CPU task on each); it raises :class:`~verl_ext.preflight.PreflightError` naming the node, which
``python -m verl_ext.main`` prints (exit status 2).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, open_dict

from verl_ext.preflight import PreflightError, _files

CPU_RUN = "scripts/train_tiny_cpu.sh"
WORKER_CPUS_PER_GPU = 3


def accelerator_resource(device: str) -> str:
    """The Ray resource verl places its workers on: ``NPU`` on Ascend, ``GPU`` otherwise (the CPU platform
    of verl_ext/cpu also asks for ``GPU``: the fake GPUs of ``ray_kwargs.ray_init.num_gpus``)."""
    return "NPU" if device == "npu" else "GPU"


def resource_problems(resources: Mapping[str, float], config: DictConfig) -> list[str]:
    """What the run needs from Ray that ``resources`` (``ray.cluster_resources()``) does not have."""
    trainer = config.trainer
    nnodes, per_node = int(trainer.nnodes), int(trainer.n_gpus_per_node)
    name = accelerator_resource(str(trainer.device))
    have, need = int(resources.get(name, 0)), nnodes * per_node
    problems = []
    if have < need:
        problems.append(
            f"Ray sees {have} {name}(s), the run needs trainer.nnodes x trainer.n_gpus_per_node = {nnodes} x "
            f"{per_node} = {need}; Ray would wait for them forever. On a cluster, start Ray on every node and "
            f"launch with RAY_ADDRESS=auto NNODES=<nodes> NGPUS_PER_NODE=<GPUs per node>; on a machine without "
            f"GPUs, train at tiny scale on CPU instead: bash {CPU_RUN}"
        )
    # CPUs: verl's resource pools ask for 3 per GPU bundle (single_controller/ray/base.py, ResourcePoolManager
    # max_colocate_count=3); TransferQueue's SimpleStorage for 1 per storage actor and 1 for its controller; this
    # task runner holds 1.
    backend = config.get("transfer_queue", {}).get("backend", {})
    units = 0
    if backend.get("storage_backend", "SimpleStorage") == "SimpleStorage":
        units = int(backend.SimpleStorage.num_data_storage_units)
    cpus, need_cpus = int(resources.get("CPU", 0)), WORKER_CPUS_PER_GPU * need + units + 2
    if cpus < need_cpus:
        problems.append(
            f"Ray sees {cpus} CPU(s), the run needs {need_cpus}: {WORKER_CPUS_PER_GPU} per {name} for verl's worker "
            f"bundles ({WORKER_CPUS_PER_GPU * need}), {units} TransferQueue storage actors "
            f"(transfer_queue.backend.SimpleStorage.num_data_storage_units), its controller and this task runner "
            f"(1 each); give Ray more CPUs (ray_kwargs.ray_init.num_cpus) or lower num_data_storage_units"
        )
    return problems


# What sizes a Ray the run starts itself (configs/cpu_platform.yaml sets the first two): ray.init refuses them when it
# joins a running cluster ("When connecting to an existing cluster, ... must not be provided", ray/_private/worker.py).
LOCAL_RAY_ONLY = ("num_cpus", "num_gpus", "resources", "object_store_memory", "labels", "_system_config")


def cluster_address(config: DictConfig, environ: Mapping[str, str]) -> str | None:
    """The Ray cluster the run joins (``ray_kwargs.ray_init.address``, else ``RAY_ADDRESS``), or None: it starts
    its own Ray on this node (also for Ray's ``local``)."""
    ray_init = config.get("ray_kwargs", {}).get("ray_init", {}) or {}
    address = ray_init.get("address") or environ.get("RAY_ADDRESS")
    return None if address in (None, "", "local") else str(address)


def drop_local_ray_settings(config: DictConfig, environ: Mapping[str, str]) -> list[str]:
    """When the run joins a cluster, remove the ``ray_kwargs.ray_init`` keys that size a Ray of its own (the
    cluster's nodes were sized by ``ray start``); returns the removed keys."""
    if cluster_address(config, environ) is None:
        return []
    ray_init = config.ray_kwargs.ray_init
    dropped = [key for key in LOCAL_RAY_ONLY if ray_init.get(key) is not None]
    with open_dict(config):
        for key in dropped:
            del ray_init[key]
    return dropped


def _writable_folder(path: Path) -> bool:
    """``path`` is a writable folder, or could be created: its nearest existing ancestor is writable."""
    for folder in (path, *path.parents):
        if folder.exists():
            return folder.is_dir() and os.access(folder, os.W_OK | os.X_OK)
    return False


def path_problems(config: DictConfig) -> list[str]:
    """The data files, the model folder and the checkpoint folder, as this node sees them."""
    problems = []
    for key in ("train_files", "val_files"):
        for path in _files(config.data.get(key)):
            if "://" in path:  # remote storage: verl copies it at run time
                continue
            if not os.access(Path(path).expanduser(), os.R_OK) or not Path(path).expanduser().is_file():
                problems.append(f"data.{key}: {path} is not a readable file here")
    model = Path(str(config.actor_rollout_ref.model.path)).expanduser()
    if "://" not in str(model) and not (model / "config.json").is_file():
        problems.append(
            f"actor_rollout_ref.model.path: {model} is not a model folder here (no config.json); the launching "
            "node resolved it, so it must be on storage every node reads at the same path"
        )
    checkpoints = config.trainer.get("default_local_dir")
    if checkpoints and "://" not in str(checkpoints) and not _writable_folder(Path(str(checkpoints)).expanduser()):
        problems.append(f"trainer.default_local_dir: {checkpoints} cannot be written here")
    return problems


def secret_problems(config: DictConfig, environ: Mapping[str, str], home: Path) -> list[str]:
    """wandb among the loggers, online, and no key on this node (``WANDB_API_KEY`` or ``wandb login``'s netrc)."""
    loggers = config.trainer.get("logger") or []
    loggers = [loggers] if isinstance(loggers, str) else list(loggers)
    if "wandb" not in loggers or environ.get("WANDB_MODE", "").lower() in ("offline", "disabled", "dryrun"):
        return []
    if environ.get("WANDB_API_KEY"):
        return []
    netrc = home / ".netrc"
    host = environ.get("WANDB_BASE_URL", "https://api.wandb.ai").split("://")[-1].split("/")[0].split(":")[0]
    if netrc.is_file() and host in netrc.read_text(errors="ignore"):
        return []
    return [
        "trainer.logger has wandb but this node has no wandb key (WANDB_API_KEY, or `wandb login`); on a cluster, "
        "export WANDB_API_KEY before `ray start` on every node, or launch with WANDB_OFFLINE=1 or LOGGER=console"
    ]


def node_label() -> str:
    """This process's host name, and its Ray node id when Ray is running."""
    label = socket.gethostname()
    try:
        import ray

        if ray.is_initialized():
            label += f" (Ray node {ray.get_runtime_context().get_node_id()})"
    except Exception:  # the label is for a message; never fail because of it
        pass
    return label


def _node_report(config: DictConfig) -> tuple[str, list[str]]:
    return node_label(), path_problems(config)


def other_nodes_problems(config: DictConfig, node_ids: list[str] | None = None, timeout_s: float = 120) -> list[str]:
    """:func:`path_problems` on other nodes of the Ray cluster (``node_ids``; default: every other alive node),
    by a 0-CPU task pinned to each, so that a model folder missing on a GPU node is found before workers start
    loading it. Each problem names its node."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if node_ids is None:
        here = ray.get_runtime_context().get_node_id()
        node_ids = [node["NodeID"] for node in ray.nodes() if node.get("Alive") and node["NodeID"] != here]
    if not node_ids:
        return []
    report = ray.remote(num_cpus=0)(_node_report)
    refs = [
        report.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node, soft=False)).remote(config)
        for node in node_ids
    ]
    try:
        reports = ray.get(refs, timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        return [f"the path check on nodes {', '.join(node_ids)} did not answer within {timeout_s:.0f} s"]
    return [f"on node {label}: {problem}" for label, problems in reports for problem in problems]


def check_task_runner_node(config: DictConfig, resources: Mapping[str, Any] | None = None) -> None:
    """Raise :class:`PreflightError` naming this node if Ray lacks what the run needs or a path is unusable
    here (then the same paths on the cluster's other nodes). ``resources`` defaults to
    ``ray.cluster_resources()``; when given, the other nodes are not asked (no Ray needed)."""
    ask_others = resources is None
    if resources is None:
        import ray

        resources = ray.cluster_resources()
    problems = resource_problems(resources, config) + path_problems(config)
    problems += secret_problems(config, os.environ, Path.home())
    if problems:
        raise PreflightError(f"the run cannot start on node {node_label()}:\n  - " + "\n  - ".join(problems))
    elsewhere = other_nodes_problems(config) if ask_others else []
    if elsewhere:
        raise PreflightError("the run cannot start:\n  - " + "\n  - ".join(elsewhere))
