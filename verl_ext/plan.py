"""What a run config means per training step, before any GPU is touched.

    python -m verl_ext.plan --config-name memagent_7b [--context-tokens N] [--gpu-memory-gib 80] [overrides]
        [--data PARQUET] [--device h100] [--devices 32] [--utilisation 0.4] [--call-tokens N] ...

Prints, from the composed config: trajectories and rows per step for a typical sample (rows unknown where the agent
does not say how many calls a sample makes), optimizer updates per step under ``recurrent.minibatch`` (mini-batches
x ``actor.ppo_epochs``; and what verl's own row counting would give), rows per update, and what the rollout engine
holds in GPU memory in each phase of a step (``rollout.free_cache_engine``; docs/fidelity.md). Then what the step
costs per phase: tokens, padding, FLOP and wall time on a stated cluster (``verl_ext/cost.py``;
docs/cluster.md,
"What a step costs"), from the agent's own ``step_shapes``. A config whose actor settings are refused, a cost input
that cannot be read, or an agent without a cost model stops with the reason (exit 2; ``--no-cost`` prints the plan).
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import asdict, dataclass

from omegaconf import DictConfig

from verl_ext import cost_report
from verl_ext.cost import step_cost
from verl_ext.minibatch import actor_settings, minibatch_mode, updates_per_step
from verl_ext.run_config import compose_run_config
from verl_ext.settings import recurrent_settings

PHASES = ("generation", "old_log_prob", "ref", "update_actor", "update_weights")


@dataclass(frozen=True)
class StepPlan:
    """A step's counts; None where they need the rows and the agent does not say how many calls a sample makes."""

    trajectories: int  # train_batch_size x n
    rows_per_trajectory: int | None  # the agent's calls for a typical sample (the memory agent: its chunks + 1)
    rows: int | None
    minibatch: str
    epochs: int  # actor.ppo_epochs: the worker takes every mini-batch this many times
    updates: int | None  # optimizer updates per step under recurrent.minibatch (mini-batches x epochs)
    rows_per_update: int | None
    verl_row_updates: int | None  # what recurrent.minibatch=rows would make
    rollout_gib_by_phase: dict[str, float]  # vLLM's share per GPU; asleep 0 (the remainder: asleep_resident)


def calls_per_trajectory(config: DictConfig, context_tokens: int | None) -> int | None:
    """The agent's own count of its calls for a typical sample, or one with a document of ``context_tokens`` (its
    registration's ``calls_per_sample``); None when the agent does not say."""
    from recurrent.interface import load_register

    settings = recurrent_settings(config)
    register = load_register(settings.agent)
    if register.calls_per_sample is None:
        return None
    facts = {} if context_tokens is None else {"context_tokens": context_tokens}
    return register.calls_per_sample(register.make_config(settings.agent_config), **facts)


def plan_step(config: DictConfig, context_tokens: int | None, gpu_memory_gib: float) -> StepPlan:
    rows_per_trajectory = calls_per_trajectory(config, context_tokens)
    actor, rollout = config.actor_rollout_ref.actor, config.actor_rollout_ref.rollout
    trajectories = int(config.data.train_batch_size) * int(rollout.n)
    rows = None if rows_per_trajectory is None else trajectories * rows_per_trajectory
    mode = minibatch_mode(config)
    epochs = actor_settings(config).epochs  # a refused setting stops here, with its reason
    verl_rows_per_update = int(actor.ppo_mini_batch_size) * int(rollout.n)
    verl_row_updates = None if rows is None else math.ceil(rows / verl_rows_per_update) * epochs
    if mode == "rows":
        updates, rows_per_update = verl_row_updates, verl_rows_per_update
    else:
        minibatches = updates_per_step(int(config.data.train_batch_size), int(actor.ppo_mini_batch_size))
        updates, rows_per_update = minibatches * epochs, None if rows is None else rows // minibatches
    # vLLM takes gpu_memory_utilization of the GPU (weights, KV cache, and its activations, CUDA graphs and
    # communication buffers). With free_cache_engine it sleeps at level 2 after the rollout (weights and KV cache
    # discarded) and is woken for the weight sync; without it the sleep is a no-op and it keeps its share through
    # every phase. Asleep counts 0 here: what level 2 keeps is asleep_resident's, an estimate, not in these figures.
    share = float(rollout.gpu_memory_utilization) * gpu_memory_gib
    released = bool(rollout.free_cache_engine)
    held = {phase: share for phase in PHASES}
    if released:
        held.update(old_log_prob=0.0, ref=0.0, update_actor=0.0)
    return StepPlan(
        trajectories, rows_per_trajectory, rows, mode, epochs, updates, rows_per_update, verl_row_updates, held
    )


def asleep_resident(rollout: DictConfig) -> str:
    """What a sleeping vLLM still holds on each GPU, with an estimate (docs/fidelity.md, "Rollout memory").

    Level-2 sleep releases the weights and the KV cache; the CUDA context, the CUDA-graph pool (unless
    ``enforce_eager``) and, with tensor parallelism, the NCCL communicators' and custom all-reduce buffers stay.
    The estimate comes from figures on vLLM's tracker, not from a measurement here."""
    tensor_parallel = int(rollout.tensor_model_parallel_size)
    kept = ["CUDA context"] + ([] if rollout.enforce_eager else ["CUDA-graph pool"])
    if tensor_parallel > 1:
        kept.append("NCCL and all-reduce buffers")
    if tensor_parallel == 1:
        estimate = "about 1 GiB"  # 0.93 GiB in use after sleep, graphs captured (vLLM PR #11743)
    elif tensor_parallel == 2:
        estimate = "1 to 2 GiB"  # plus NCCL buffers, about 1 GiB per rank at tensor-parallel 4 (vLLM PR #51485)
    else:
        estimate = "several GiB"  # 6.8 to 7.0 GiB per GPU at tensor-parallel 8 (vLLM issue #47654)
    return f"{estimate} per GPU ({', '.join(kept)}; estimated, not counted above)"


def compose(config_name: str, overrides: list[str]) -> DictConfig:
    from omegaconf import OmegaConf

    config = compose_run_config(config_name, overrides)
    OmegaConf.resolve(config)
    return config


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config-name", default="memagent_7b", help="a config of configs/ (default memagent_7b)")
    parser.add_argument(
        "--context-tokens", type=int, help="a typical sample's document (default: the agent's; the memory agent's 28K)"
    )
    parser.add_argument("--gpu-memory-gib", type=float, default=80.0, help="memory of one GPU (default 80)")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. recurrent.minibatch=rows")
    cost_report.add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        if args.cost:
            cost_report.check_arguments(args)  # before the config is composed: a typo costs no wait
    except ValueError as err:
        print(f"[memagent] {err}", file=sys.stderr)
        sys.exit(2)
    config = compose(args.config_name, args.overrides)
    from verl_ext.preflight import sampling_problems, single_trajectory_problem

    # The trainer's own sampling checks first: rollout.n < 1 would otherwise divide by zero below.
    problems = sampling_problems(config)
    if problems:
        print("[memagent] the run cannot start:\n  - " + "\n  - ".join(problems), file=sys.stderr)
        sys.exit(2)
    single = single_trajectory_problem(config)
    if single is not None:
        print(f"[memagent] warning: {single}", file=sys.stderr)
    try:
        plan = plan_step(config, args.context_tokens, args.gpu_memory_gib)
        if args.cost:
            inputs = cost_report.CostInputs(config, args)  # bad input stops here, before the model's work
            cost = step_cost(config, inputs.shape, inputs.trajectories(), inputs.cluster)
    except ValueError as err:  # a refused setting or input: the reason, not a traceback; 2 as the launcher's checks
        print(f"[memagent] {err}", file=sys.stderr)
        sys.exit(2)
    for name, value in asdict(plan).items():
        if name != "rollout_gib_by_phase":
            print(f"{name:>20}: {'unknown' if value is None else value}")
    if plan.rows is None:
        print(f"{'unknown':>20}: the agent does not say how many calls a sample makes (its calls_per_sample)")
    print(f"{'rollout GiB / GPU':>20}: " + ", ".join(f"{k} {v:.1f}" for k, v in plan.rollout_gib_by_phase.items()))
    rollout = config.actor_rollout_ref.rollout
    if rollout.name == "vllm" and rollout.free_cache_engine:
        print(f"{'asleep, vLLM keeps':>20}: " + asleep_resident(rollout))
    if args.cost:
        print("\n".join(cost_report.report(config, inputs, cost)))


if __name__ == "__main__":
    main()
