"""What one training step costs, per phase, before it runs (docs/cluster.md, "What a step costs").

Tokens come from the data: the agent says each prompt's trajectory, its calls' prompt and response lengths (its
registration's ``step_shapes``: recurrent/step_shapes.py), ``rollout.n`` trajectories per prompt,
``train_batch_size`` prompts per step. The rows are laid out over the data-parallel ranks and into updates by the
trainer's own plan (``verl_ext.minibatch``), and cut into micro-batches as verl 0.9.1's engine cuts them
(:func:`micro_batches`), so padding (sdpa: every row of a micro-batch as long as its longest) and the wait for the
slowest rank are counted.
FLOP per micro-batch come from ``recurrent.flops``. Wall time: FLOP over (devices x peak x utilisation) for every
pass, and for the rollout's decode the bytes each step reads (weights, then each sequence's key/value cache) over
memory bandwidth. Utilisation and bandwidth efficiency are assumptions, stated with every figure; the CPU's
constants are calibrated (``verl_ext.cost_calibration``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from omegaconf import DictConfig

from recurrent.flops import BACKWARD_FACTOR, GPU_SPECS, NO_WORK, ForwardCount, ModelShape, forward_count
from recurrent.step_shapes import CallShape
from verl_ext.minibatch import Row, actor_settings, minibatch_mode, plan_minibatches, spread_over_ranks

TRAINING_PHASES = ("old_log_prob", "ref", "update_actor")
PHASES = ("gen", *TRAINING_PHASES)


@dataclass(frozen=True)
class Device:
    """One accelerator (or one CPU rank): dense peak at the training dtype, memory bandwidth, and a fixed time per
    decode step (kernel launches, scheduling; 0 where CUDA graphs hide it)."""

    name: str
    peak_flops: float
    memory_bandwidth: float  # bytes/s
    decode_step_s: float = 0.0
    calibrated: bool = False  # the peak is a measured effective rate (utilisation 1), not a data sheet's


DEVICES = {
    kind: Device(f"{name} ({peak / 1e12:g} TFLOP/s dense bf16, {bandwidth / 1e12:g} TB/s)", peak, bandwidth)
    for kind, (name, peak, bandwidth) in GPU_SPECS.items()
} | {
    # One rank of this project's 2-core CPU machine, fp32: fitted on the replication's step (docs/cluster.md,
    # "Calibrated on the CPU trainer"), not a data sheet: the "peak" is the effective rate (utilisation 1), and a
    # decode step's fixed time stands for the CPU server's per-token work (the bandwidth term is left out).
    "cpu": Device("CPU rank (calibrated, fp32)", 8.33e9, 1e15, 0.111, calibrated=True),
}


@dataclass(frozen=True)
class Cluster:
    device: Device
    devices: int
    utilisation: dict[str, float]  # per phase, of the device's peak
    bandwidth_efficiency: float = 0.7  # of the memory bandwidth the rollout's decode reaches

    def flop_seconds(self, flops: float, phase: str, devices: int = 1) -> float:
        return flops / (devices * self.device.peak_flops * self.utilisation[phase])


@dataclass
class PhaseCost:
    name: str
    tokens: int = 0  # real tokens through the pass (the rollout: prefilled and decoded)
    computed_tokens: int = 0  # positions computed, padding included
    flops: float = 0.0  # all ranks together
    seconds: float = 0.0
    micro_batches: int = 0  # per rank
    decode_steps: int = 0  # the rollout: tokens each replica decodes one after another
    notes: list[str] = field(default_factory=list)

    @property
    def padding(self) -> float:
        """Share of the computed positions that are padding."""
        return 1 - self.tokens / self.computed_tokens if self.computed_tokens else 0.0


@dataclass(frozen=True)
class StepCost:
    phases: dict[str, PhaseCost]
    rows: int
    trajectories: int

    @property
    def seconds(self) -> float:
        return sum(p.seconds for p in self.phases.values())


# ---- the step's rows and their layout ----


def step_rows(trajectories: Sequence[list[CallShape]], n: int) -> list[Row]:
    """The rows of a step: every prompt's calls, ``n`` trajectories each, keyed ``{uid}_{session}_{index}``."""
    return [
        Row(f"p{prompt}_{session}_{index}", call.length)
        for prompt, calls in enumerate(trajectories)
        for session in range(n)
        for index, call in enumerate(calls)
    ]


def rank_layout(config: DictConfig, rows: Sequence[Row], dp: int) -> list[list[list[int]]]:
    """``[rank][update] -> row lengths`` as the trainer lays a step out (``verl_ext.minibatch``); verl's
    zero-mask
    padding rows count with verl's synthetic length. With ``recurrent.minibatch=rows`` (verl's own counting) the
    rows are dealt by length and each rank's share cut into equal contiguous mini-batches, as verl cuts them."""
    from verl.trainer.ppo.padding_utils import SYNTHETIC_PADDING_SEQ_LEN

    actor = config.actor_rollout_ref.actor
    settings = actor_settings(config)
    mode = minibatch_mode(config)
    if mode == "rows":
        per_update = int(actor.ppo_mini_batch_size) * int(config.actor_rollout_ref.rollout.n)
        updates = math.ceil(len(rows) / per_update)
        shares = spread_over_ranks(range(len(rows)), rows, dp)
        return [[[rows[p].seq_len for p in part] for part in _split(share, updates)] for share in shares]
    updates = int(config.data.train_batch_size) // int(actor.ppo_mini_batch_size)
    plan = plan_minibatches(rows, updates, dp, mode, settings.row_multiple)
    slot = plan.slot_rows
    length = [SYNTHETIC_PADDING_SEQ_LEN if p is None else rows[p].seq_len for p in plan.order]
    shard = plan.num_minibatches * slot
    return [
        [length[r * shard + g * slot : r * shard + (g + 1) * slot] for g in range(plan.num_minibatches)]
        for r in range(dp)
    ]


def _split(items: Sequence[int], parts: int) -> list[list[int]]:
    size = math.ceil(len(items) / parts)
    return [list(items[i : i + size]) for i in range(0, len(items), size)]


def micro_batches(
    per_rank: Sequence[Sequence[int]], max_tokens: int | None, rows: int | None = None
) -> list[list[list[int]]]:
    """Each rank's rows cut into micro-batches, as verl 0.9.1's engine cuts them (``prepare_micro_batches``).

    Token budget (``max_tokens``; ``use_dynamic_bsz``): ``rearrange_micro_batches`` takes ceil(tokens / budget)
    micro-batches, the same count on every rank (the largest), partitions each rank's rows with verl's
    Karmarkar-Karp heuristic on its workload estimate, and adds one more micro-batch until every one is within
    the budget. Static (``rows``): contiguous runs of that many rows. Ranks holding the same lengths are cut once
    (the heuristic costs about a second for 450 rows into 85 parts)."""
    if max_tokens is None:
        if rows is None:
            raise ValueError("micro_batches needs max_tokens (use_dynamic_bsz) or rows")
        return [[list(share[i : i + rows]) for i in range(0, len(share), rows)] for share in per_rank]
    longest = max((n for share in per_rank for n in share), default=0)
    if longest > max_tokens:
        raise ValueError(f"a row of {longest} tokens exceeds the micro-batch budget of {max_tokens} tokens")
    distinct = sorted({tuple(sorted(share, reverse=True)) for share in per_rank}, key=sum, reverse=True)
    count = max(min(len(share), math.ceil(sum(share) / max_tokens)) for share in distinct)
    fewest = min(len(share) for share in distinct)
    while True:  # verl's loop: the first count at which every rank's partition fits; a failing rank is tried first
        if count > fewest:
            raise ValueError(f"{count} micro-batches within {max_tokens} tokens, but a rank holds only {fewest} rows")
        failing = next(
            (i for i, share in enumerate(distinct) if max(map(sum, _balanced_parts(share, count))) > max_tokens), None
        )
        if failing is None:
            return [_balanced_parts(tuple(sorted(share, reverse=True)), count) for share in per_rank]
        distinct.insert(0, distinct.pop(failing))
        count += 1


@functools.lru_cache(maxsize=4096)
def _balanced_parts(lengths: tuple[int, ...], count: int) -> list[list[int]]:
    """verl's partition of these rows into ``count`` micro-batches (cached: the old log-prob and reference passes cut
    the same shards with the same budget by default)."""
    from verl.utils.seqlen_balancing import calculate_workload, get_seqlen_balanced_partitions

    parts = get_seqlen_balanced_partitions([calculate_workload(n) for n in lengths], count, equal_size=False)
    return [[lengths[i] for i in part] for part in parts]


def synced_pass(
    shape: ModelShape, per_rank_micro: Sequence[Sequence[Sequence[int]]], packed: bool
) -> tuple[ForwardCount, int]:
    """One forward pass over every rank's micro-batches: the count summed over ranks, and the FLOP of the critical
    path. Every micro-batch ends in collectives (FSDP's gathers and reductions), so ranks go through their i-th
    micro-batches together (verl orders each rank's by the same workload rule): the slowest one sets the pace."""
    total, counts = NO_WORK, []
    for rank in per_rank_micro:
        per_micro = sorted((forward_count(shape, mb, packed) for mb in rank), key=lambda c: -c.flops)
        counts.append(per_micro)
        for c in per_micro:
            total = total + c
    slowest = sum(max(rank[i].flops for rank in counts if i < len(rank)) for i in range(max(map(len, counts))))
    return total, slowest


# ---- the phases ----


def training_phase(
    name: str, shape: ModelShape, per_rank_micro: Sequence, packed: bool, multiplier: int, cluster: Cluster
) -> PhaseCost:
    total, critical = synced_pass(shape, per_rank_micro, packed)
    return PhaseCost(
        name,
        tokens=total.tokens,
        computed_tokens=total.computed_tokens,
        flops=float(total.flops * multiplier),
        seconds=cluster.flop_seconds(critical * multiplier, name),
        micro_batches=len(per_rank_micro[0]) if per_rank_micro else 0,
    )


def rollout_phase(
    config: DictConfig, shape: ModelShape, trajectories: Sequence[list[CallShape]], n: int, cluster: Cluster
) -> PhaseCost:
    """vLLM's (or the CPU server's) rollout: prefill at the device's FLOP rate, decode by memory bandwidth.

    Trajectories spread evenly over the replicas (``devices / tensor_model_parallel_size``). Decode runs the
    trajectories' calls one after another, a token per step for every sequence in flight: the longest trajectory's
    generated tokens are the replica's steps (times the waves when more trajectories than ``max_num_seqs`` share a
    replica). Each step reads the weights once and each sequence's key/value cache; it takes the longer of that
    read and the step's FLOP. No prefix-cache hits are counted (a group's first call is the same prompt n times)."""
    rollout = config.actor_rollout_ref.rollout
    tp = int(rollout.tensor_model_parallel_size)
    replicas = max(1, cluster.devices // tp)
    device = cluster.device
    prefill = decode_flops = kv_read = 0
    prompt_tokens = decoded = 0
    for calls in trajectories:
        for t in calls:
            prompt_tokens += t.prompt * n
            decoded += t.response * n
            prefill += forward_count(shape, [t.prompt], packed=True).flops * n
            pairs = t.length * (t.length + 1) // 2 - t.prompt * (t.prompt + 1) // 2
            decode_flops += (shape.linear_flops(t.response) + shape.attention_flops(pairs)) * n
            kv_read += pairs * shape.kv_bytes_per_token() * n  # each step reads its sequence's cache so far
    per_replica = math.ceil(len(trajectories) * n / replicas)
    waves = math.ceil(per_replica / int(rollout.max_num_seqs))
    steps = waves * max(sum(t.response for t in calls) for calls in trajectories)
    bandwidth = tp * device.memory_bandwidth * cluster.bandwidth_efficiency
    read_s = (steps * shape.parameters * 2 + kv_read / replicas) / bandwidth  # bf16 weights
    compute_s = cluster.flop_seconds(decode_flops / replicas, "gen", tp)
    seconds = (
        cluster.flop_seconds(prefill / replicas, "gen", tp) + max(read_s, compute_s) + steps * device.decode_step_s
    )
    bound = "memory reads" if read_s >= compute_s else "FLOP"
    return PhaseCost(
        "gen",
        tokens=prompt_tokens + decoded,
        computed_tokens=prompt_tokens + decoded,
        flops=float(prefill + decode_flops),
        seconds=seconds,
        decode_steps=steps,
        notes=[
            f"prefill {prompt_tokens:,}, decode {decoded:,} tokens; {replicas} replicas of {tp} "
            f"device(s), {steps} decode steps each, bound by {bound}"
        ],
    )


# Where verl 0.9.1's engine worker reads each pass's micro-batches (``engine_workers.py``): the section, its switch
# between a token budget and a row count, the token budget, the row count.
PASS_SETTINGS = {
    "old_log_prob": (
        "rollout",
        "log_prob_use_dynamic_bsz",
        "log_prob_max_token_len_per_gpu",
        "log_prob_micro_batch_size_per_gpu",
    ),
    "ref": ("ref", "log_prob_use_dynamic_bsz", "log_prob_max_token_len_per_gpu", "log_prob_micro_batch_size_per_gpu"),
    "update_actor": ("actor", "use_dynamic_bsz", "ppo_max_token_len_per_gpu", "ppo_micro_batch_size_per_gpu"),
}


def pass_micro_batches(config: DictConfig, phase: str, per_rank: Sequence[Sequence[int]]) -> list[list[list[int]]]:
    name, dynamic, tokens, rows = PASS_SETTINGS[phase]
    section = config.actor_rollout_ref[name]
    if bool(section[dynamic]):
        return micro_batches(per_rank, int(section[tokens]))
    return micro_batches(per_rank, None, int(section[rows]))


def step_cost(
    config: DictConfig, shape: ModelShape, trajectories: Sequence[list[CallShape]], cluster: Cluster
) -> StepCost:
    """The cost of one step whose prompts have these trajectories' calls (each rolled out ``rollout.n`` times)."""
    from verl.trainer.ppo.utils import need_reference_policy

    section = config.actor_rollout_ref
    n = int(section.rollout.n)
    rows = step_rows(trajectories, n)
    layout = rank_layout(config, rows, cluster.devices)  # FSDP data parallel over every device (no Ulysses)
    shards = [[length for update in rank for length in update] for rank in layout]
    packed = bool(section.model.use_remove_padding)
    phases = {"gen": rollout_phase(config, shape, trajectories, n, cluster)}
    if bool((config.algorithm.get("rollout_correction") or {}).get("bypass_mode", False)):
        phases["old_log_prob"] = PhaseCost("old_log_prob", notes=["the rollout's log-probs (bypass_mode): no pass"])
    else:
        micro = pass_micro_batches(config, "old_log_prob", shards)
        phases["old_log_prob"] = training_phase("old_log_prob", shape, micro, packed, 1, cluster)
    if need_reference_policy(config):
        phases["ref"] = training_phase("ref", shape, pass_micro_batches(config, "ref", shards), packed, 1, cluster)
    else:
        phases["ref"] = PhaseCost("ref", notes=["no reference policy (no KL loss or reward)"])
    recompute = 1 if section.model.get("enable_gradient_checkpointing", False) else 0
    multiplier = 1 + BACKWARD_FACTOR + recompute
    epochs = actor_settings(config).epochs
    update = PhaseCost("update_actor")
    for g in range(len(layout[0])):  # one optimizer update per mini-batch, each cut into its own micro-batches
        micro = pass_micro_batches(config, "update_actor", [rank[g] for rank in layout])
        part = training_phase("update_actor", shape, micro, packed, multiplier, cluster)
        update.tokens += part.tokens * epochs
        update.computed_tokens += part.computed_tokens * epochs
        update.flops += part.flops * epochs
        update.seconds += part.seconds * epochs
        update.micro_batches += part.micro_batches * epochs
    update.notes.append(
        f"forward + backward ({BACKWARD_FACTOR}x)"
        + (" + recomputation" if recompute else "")
        + f"; {len(layout[0]) * epochs} updates"
    )
    phases["update_actor"] = update
    return StepCost(phases, len(rows), len(trajectories) * n)
