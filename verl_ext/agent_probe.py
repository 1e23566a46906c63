"""The preflight's trial episode: one episode of the configured agent, run before the launch.

Most of a new agent's mistakes show only when it runs: it returns without calling the model, passes sampling the
trainer cannot honour, leaves a call running when it returns, or raises on every sample. In training each of these
fails every trajectory minutes after the launch, inside Ray workers. The preflight runs one episode first, in this
process, through the route training uses (the run's mode: one coroutine, or a lockstep batch of one; the
:class:`~verl_ext.rollout.TokenClient` and its checks; the rows built from the episode; the agent's tools run for
real), against a scripted model that answers every call with the same short text. A failure is one line naming
the agent's file and line (recurrent/failures.py)::

    my_agent.py:14: ZeroDivisionError: division by zero (agent 'sc', its trial episode before the launch: ...)

The scripted reply (:data:`SCRIPTED_REPLY`, a boxed number) only has to let the agent run to its end; an agent
whose control flow needs a real model's replies should not raise on this one.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import sys
from pathlib import Path
from typing import Any

from omegaconf import DictConfig
from verl.workers.rollout.replica import TokenOutput

from recurrent.agent_thread import Deadline
from recurrent.async_manager import run_session
from recurrent.failures import describe_failure, shown
from recurrent.functions import REPLY_GATE
from verl_ext.held_replies import ReplyGate
from verl_ext.rollout import AgentRollout, Budgets, RowOutput, TokenClient
from verl_ext.settings import RecurrentSettings
from verl_ext.sync_rollout import Trajectory, run_trajectories
from verl_ext.trajectory_deadline import TrajectoryTimeoutError

SCRIPTED_REPLY = "The answer is \\boxed{0}."
TIMEOUT_S = 120.0  # an episode against a scripted model; the agent's own tools take what they take
TIMEOUT_KEY = "the preflight's bound on a trial episode"


class ScriptedServer:
    """verl's server manager as the agent loop sees it (``generate(request_id, prompt_ids=..., sampling_params=...)``):
    every call is answered with :data:`SCRIPTED_REPLY` and the end token, cut to the call's ``max_tokens``."""

    def __init__(self, tokenizer: Any) -> None:
        self.reply_ids = tokenizer.encode(SCRIPTED_REPLY, add_special_tokens=False) + [tokenizer.eos_token_id]
        self.calls = 0

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **_: Any):
        self.calls += 1
        await asyncio.sleep(0)  # a server answers later, never within the call
        ids = self.reply_ids[: int(sampling_params["max_tokens"])]
        log_probs = [-0.1] * len(ids) if sampling_params.get("logprobs") else None
        return TokenOutput(token_ids=ids, log_probs=log_probs, stop_reason="completed", extra_fields={})


def rollout_sampling(config: DictConfig) -> dict[str, Any]:
    """The sampling parameters verl's agent-loop worker gives every trajectory (``agent_loop_tq.py``)."""
    rollout = config.actor_rollout_ref.rollout
    return {
        "temperature": rollout.temperature,
        "top_p": rollout.top_p,
        "top_k": rollout.top_k,
        "repetition_penalty": 1.0,
        "logprobs": rollout.calculate_log_probs,
    }


def first_sample(path: str, prompt_key: str) -> dict[str, Any] | None:
    """The first row of a local parquet file as verl's dataset hands it to the agent loop (None: no local file)."""
    file = Path(path).expanduser()
    if "://" in path or not file.is_file():
        return None
    import pyarrow.parquet as pq

    table = pq.ParquetFile(file).read_row_group(0)
    if table.num_rows == 0:
        return None
    row = table.slice(0, 1).to_pylist()[0]
    row.setdefault("extra_info", None)
    return {
        **row,
        "raw_prompt": row.get(prompt_key),
        "extra_info": row["extra_info"] or {},
        "index": 0,
        "uid": "preflight",
        "session_id": 0,
        "global_steps": 0,
    }


ORIGIN_DEPTH = 32  # frames kept of where each coroutine was made: a call handed to a task is named at its line


async def run_episode(
    rollout: AgentRollout, mode: str, sample: dict[str, Any], params: dict[str, Any]
) -> list[RowOutput]:
    """One episode of the agent in the run's mode, to its rows. Each reply is held until the agent awaits its call
    (verl_ext/held_replies.py), and where each coroutine was made is tracked, so that a call left running fails
    the episode at the line that made it."""
    server = ScriptedServer(rollout.tokenizer)
    depth = sys.get_coroutine_origin_tracking_depth()
    sys.set_coroutine_origin_tracking_depth(ORIGIN_DEPTH)
    gate = REPLY_GATE.set(ReplyGate())
    try:
        if mode == "sync":
            (result,) = await run_trajectories(rollout, server, [Trajectory(sample, 0, params)], report=False)
            if isinstance(result, Exception):
                raise result
            return result  # type: ignore[return-value]
        episode = await rollout.episode(sample)
        await run_session(episode, TokenClient(rollout, server, "preflight", params), deadline=rollout.deadline)
        return rollout.outputs(episode, want_logprobs=bool(params.get("logprobs")))
    finally:
        REPLY_GATE.reset(gate)
        sys.set_coroutine_origin_tracking_depth(depth)


def run_in_own_loop(coroutine: Any) -> Any:
    """``asyncio.run``, in a thread when the caller already runs an event loop (a notebook, an async test)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


def trial_deadline(run: Deadline | None, mode: str) -> Deadline:
    """The trial episode's deadline: the run's ``recurrent.trajectory_timeout_s`` where it is shorter than
    :data:`TIMEOUT_S`, else that bound (the agent's code runs in its own thread: it holds whatever the code does)."""
    if run is not None and run.seconds <= TIMEOUT_S:
        return run
    return Deadline(TIMEOUT_S, TIMEOUT_KEY, "its trial episode", mode == "async", TrajectoryTimeoutError)


def probe_problem(config: DictConfig, settings: RecurrentSettings, tokenizer: Any, budgets: Budgets) -> str | None:
    """The one-line problem of the agent's trial episode on the first training sample, then of the run's reward
    function on its rows (verl_ext/trial_reward.py), or None when both ran."""
    files = config.data.get("train_files")
    first = files if isinstance(files, str) else (list(files)[0] if files else None)
    sample = first_sample(str(first), config.data.prompt_key) if first is not None else None
    if sample is None:
        return None  # remote or missing data: the data checks report it
    rollout = AgentRollout(settings, tokenizer, budgets, float(config.actor_rollout_ref.rollout.temperature))
    name = getattr(rollout.agent, "name", settings.agent)
    trial = (
        f"(agent {name!r}, its trial episode before the launch: the first sample of {shown(str(first))} against a "
        f"scripted model, in {settings.mode} mode; recurrent.preflight_episode=false skips it)"
    )
    rollout.deadline = trial_deadline(rollout.deadline, settings.mode)
    try:
        outputs = run_in_own_loop(run_episode(rollout, settings.mode, sample, rollout_sampling(config)))
    except Exception as err:  # a deadline's too: named at the line the agent was at
        return f"{describe_failure(err, rollout.source)} {trial}"
    from verl_ext.trial_reward import trial_reward_problem

    row = {key: value for key, value in sample.items() if key not in rollout.large_columns}  # as the reward gets it
    return trial_reward_problem(config, outputs, row, tokenizer, settings.reward_trajectory, run_in_own_loop)
