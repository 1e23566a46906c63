"""Helpers shared by the verl_ext tests (a plain module: test files import it by name)."""

from __future__ import annotations

import copy
from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

import verl_ext  # noqa: F401  (registers the configs' resolvers)

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"

# Small budgets for the tiny model: several chunks from a short document, distinct caps per turn kind.
TINY_BUDGETS = [
    "recurrent.config.chunk_size=16",
    "recurrent.config.max_prompt_length=32",
    "recurrent.config.max_memorization_length=8",
    "recurrent.config.max_final_response_length=6",
    "recurrent.config.max_chunks=8",
]


_COMPOSED: dict[tuple[str, tuple[str, ...]], DictConfig] = {}


def compose_config(name: str, overrides: list[str] | None = None) -> DictConfig:
    """A config of ``configs/`` composed by Hydra with ``overrides``: once per test process for each name and
    overrides (a composition reads ~35 YAML files, about a second; ``configs/`` does not change while the suite
    runs), a fresh copy on every call (tests change theirs)."""
    key = (name, tuple(overrides or []))
    if key not in _COMPOSED:
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
            _COMPOSED[key] = compose(config_name=name, overrides=list(key[1]))
    return copy.deepcopy(_COMPOSED[key])


class LocalHandle:
    """A reward-worker actor handle that runs verl's real RewardLoopWorker in this process."""

    def __init__(self, worker) -> None:
        self.compute_score = type("Method", (), {"remote": staticmethod(worker.compute_score)})()


def make_worker(config: DictConfig, tokenizer, llm_client=None):
    """The worker of the manager class the config names (verl's AgentLoopWorkerTQ underneath), without Ray, wired
    to a real reward worker."""
    from verl.experimental.reward_loop.reward_loop import RewardLoopWorker
    from verl.utils.dataset.rl_dataset import RLHFDataset
    from verl.utils.import_utils import load_class_from_fqn

    manager = load_class_from_fqn(config.actor_rollout_ref.rollout.agent.agent_loop_manager_class, "AgentLoopManager")
    worker = object.__new__(manager.worker_impl)
    worker.config, worker.tokenizer, worker.processor, worker.llm_client = config, tokenizer, None, llm_client
    worker.distillation_enabled, worker.mm_processor_kwargs, worker.background_tasks = False, {}, set()
    worker.tools, worker.hf_model_type, worker.dataset_cls = [], None, RLHFDataset
    worker.reward_loop_worker_handles = [LocalHandle(RewardLoopWorker(config))]
    return worker


def capture_transfer_queue(monkeypatch) -> dict[str, list]:
    """Record what verl's worker writes to TransferQueue (rows and prompt status tags) instead of writing it."""
    import transfer_queue

    log: dict[str, list] = {"rows": [], "status": [], "errors": []}

    async def batch_put(keys, fields, tags, partition_id):
        log["rows"].append({"keys": keys, "fields": fields, "tags": tags, "partition_id": partition_id})

    async def put(key, partition_id, tag):
        if "status" in tag:
            log["status"].append((key, partition_id, tag["status"]))
        if "error" in tag:  # a prompt's first failed trajectory, for the trainer (verl_ext/failures.py)
            log["errors"].append((key, partition_id, tag["error"]))

    monkeypatch.setattr(transfer_queue, "async_kv_batch_put", batch_put)
    monkeypatch.setattr(transfer_queue, "async_kv_put", put)
    return log


def load_example(name: str):
    """A script of ``examples/`` as a module (the walkthroughs are scripts, not a package)."""
    import importlib.util

    path = CONFIG_DIR.parent / "examples" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"examples_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def recurrent_agent_loop(config, tokenizer, server):
    """Our agent loop (verl_ext/agent_loop.py), constructed the way verl's agent-loop worker constructs it."""
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from verl_ext.agent_loop import RecurrentAgentLoop

    return RecurrentAgentLoop(
        trainer_config=DictConfigWrap(config),
        server_manager=server,
        tokenizer=tokenizer,
        processor=None,
        dataset_cls=RLHFDataset,
        data_config=DictConfigWrap(config.data),
    )
