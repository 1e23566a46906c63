"""Any registered agent on verl's rollout API: one episode per trajectory, one row per model call.

The only glue between an agent (its function: prompts and control flow live there) and verl: it builds the agent
named by ``recurrent.agent`` with ``recurrent.config`` (verl_ext/settings.py), checks the agent's widest call against
``rollout.prompt_length`` / ``rollout.response_length``, hands each episode a :class:`TokenClient` whose calls go
to verl's token-in/token-out server (``server.generate(request_id, prompt_ids=..., sampling_params=...)``, a call's
own ``temperature`` / ``top_p`` over the rollout's), and turns a finished episode into ``list[AgentLoopOutput]``:
one output per model call, the answer last, each carrying the temperature that sampled it (the actor computes the
row's log-probs at it: verl_ext/row_sampling.py). Both rollout modes use it: :mod:`verl_ext.agent_loop` (async,
one coroutine per trajectory) and :mod:`verl_ext.sync_rollout` (sync, all trajectories of a batch in lockstep
rounds).
"""

from __future__ import annotations

import asyncio
import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig
from pydantic import Field
from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput
from verl.workers.rollout.replica import TokenOutput

from recurrent.async_manager import check_finished
from recurrent.functions import FunctionEpisode
from recurrent.interface import Episode, Reply, TurnRecord, Workflow, load_register
from recurrent.sampling import check_value
from recurrent.templating import chat_prompt_ids
from recurrent.tokens import end_token_ids
from verl_ext.settings import RecurrentSettings, recurrent_settings
from verl_ext.trajectory_deadline import trajectory_deadline

# What an agent may set on a call in training (docs/write_your_own_agent.md, "Sampling of its own"): the server
# samples that call with it, and the row's log-probs are computed at its temperature. Anything else (seed, stop,
# penalties) would be sampled with but not trained with, or not be honoured by every rollout server: refused.
CALL_SAMPLING = ("temperature", "top_p")


def call_sampling_params(rollout_params: dict[str, Any], own: dict[str, Any]) -> dict[str, Any]:
    """The sampling of one call: the rollout's, with the agent's own :data:`CALL_SAMPLING` over it; a ValueError
    names any other field, or a value the trainer cannot train on."""
    refused = sorted(set(own) - set(CALL_SAMPLING))
    if refused:
        raise ValueError(
            f"an agent passed sampling parameters {refused} in training; a call may set {' and '.join(CALL_SAMPLING)} "
            "(its row records them), the rollout's (actor_rollout_ref.rollout.*) apply to the rest "
            "(docs/write_your_own_agent.md, 'Sampling of its own')"
        )
    for key, value in own.items():
        check_value(key, value)
    if own.get("temperature") == 0:
        raise ValueError(
            "temperature=0 (greedy decoding) cannot be trained on: the actor's log-probs divide the logits by the "
            "row's temperature; give the call a small positive one (e.g. 0.1)"
        )
    return {**rollout_params, **own}


class RowOutput(AgentLoopOutput):
    """One call's row: verl's output plus the temperature that sampled it, stored as the row's ``temperature``
    field (verl's actor reads a per-row one: verl_ext/row_sampling.py). The answer's row also holds the
    episode's calls and the agent's own score for the reward (not stored: verl_ext/agent_loop_manager.py)."""

    temperature: float = 1.0
    trajectory: list[dict[str, Any]] | None = Field(default=None, exclude=True)
    agent_score: float | None = Field(default=None, exclude=True)

    def as_dict(self) -> dict[str, Any]:
        output = super().as_dict()
        output["temperature"] = torch.tensor(float(self.temperature), dtype=torch.float32)
        return output


def turn_kind(record: TurnRecord, last: bool) -> str:
    """A call's kind as its row and the reward's trajectory both label it: ``final`` for the episode's last call
    (the answer the reward scores, flagged in advance or not), else the kind the agent gave it (``call``)."""
    return "final" if last else str(record.turn.meta.get("kind", "call"))


def call_view(record: TurnRecord, last: bool) -> dict[str, Any]:
    """What a reward function reads of one call (``extra_info["trajectory"]``): its messages, its reply's text, its
    kind (:func:`turn_kind`), how it finished, and its own sampling."""
    return {
        "messages": record.turn.messages,
        "reply": record.reply.text,
        "kind": turn_kind(record, last),
        "finish_reason": record.reply.finish_reason,
        "sampling": dict(record.turn.sampling),
        **made_by(record),
    }


def made_by(record: TurnRecord) -> dict[str, Any]:
    """The request a call answered and its choice (``n`` completions of one ``openai``-client request are its
    choices 0..n-1; recurrent/openai_route.py); None for a call made on the framework's client."""
    return {"request": record.turn.meta.get("request"), "choice": record.turn.meta.get("choice")}


def reward_extra_info(outputs: list[AgentLoopOutput], row: dict[str, Any], with_trajectory: bool) -> dict[str, Any]:
    """The reward function's ``extra_info`` for a trajectory's rows: the dataset row's own ``extra_info``, plus the
    agent's score (``agent_score``) and, ``with_trajectory`` (``recurrent.reward_trajectory``), every call
    (``trajectory``: :func:`call_view`) and the row (``sample``, without its ``extra_info``). Training
    (verl_ext/agent_loop_manager.py) and the preflight's trial reward (verl_ext/agent_probe.py) both build it here."""
    extra = dict(row.get("extra_info") or {})
    final = outputs[-1]
    if getattr(final, "agent_score", None) is not None:
        extra["agent_score"] = final.agent_score
    trajectory = getattr(final, "trajectory", None)
    if trajectory is not None and with_trajectory:
        extra["trajectory"] = trajectory
        extra["sample"] = {key: value for key, value in row.items() if key != "extra_info"}
    return extra


@dataclass(frozen=True)
class Budgets:
    """verl's per-row widths: every call's prompt and response must fit (``rollout.prompt_length`` is
    ``data.max_prompt_length`` and sizes vLLM's ``max_model_len`` together with ``response_length``)."""

    prompt_length: int
    response_length: int


def build_agent(settings: RecurrentSettings, tokenizer: Any) -> Workflow:
    """The agent named by ``recurrent.agent`` with ``recurrent.config``, built for training."""
    if not settings.agent:
        raise ValueError("recurrent.agent is not set: name the agent to train (e.g. recurrent.agent=memory)")
    return load_register(settings.agent).for_training(settings.agent_config, tokenizer)


def check_budgets(agent: Workflow, budgets: Budgets) -> None:
    """Raise a ValueError naming the agent's settings and verl's keys when one of its calls could not fit a row.

    In the fork such a turn widened one round's tensors and broke their concatenation; here the mismatch is found
    before the run. An agent that cannot bound its calls (no ``row_widths``) is checked call by call instead."""
    widths = agent.row_widths()
    if widths is None:
        return
    problems = []
    if widths.prompt > budgets.prompt_length:
        problems.append(
            f"its longest call prompt is {widths.prompt} tokens ({widths.made_of}) but "
            f"actor_rollout_ref.rollout.prompt_length (data.max_prompt_length) is {budgets.prompt_length}"
        )
    if widths.response > budgets.response_length:
        problems.append(
            f"a call may generate {widths.response} tokens ({widths.made_of}) but "
            f"actor_rollout_ref.rollout.response_length (data.max_response_length) is {budgets.response_length}"
        )
    if problems:
        raise ValueError("the agent's settings (recurrent.config) do not fit verl's rows: " + "; ".join(problems))


def finish_reason(token_ids: list[int], max_tokens: int, end_ids: frozenset[int]) -> str:
    """The finish reason of a call: "length" when it used its whole budget without ending on an end token
    (:func:`recurrent.tokens.end_token_ids`), else "stop" (verl's servers report "completed" for both)."""
    if len(token_ids) >= max_tokens and (not token_ids or token_ids[-1] not in end_ids):
        return "length"
    return "stop"


class TokenClient:
    """The chat client an episode gets in training: each call is one request to verl's token server.

    A call's prompt is ``prompt_ids`` when the agent built it in token space (the memory agent: no decode and
    re-encode of long chunks), else its messages rendered by the tokenizer's chat template with the generation
    prompt. Every call of a trajectory carries one request id, so verl's load balancer routes them to one server
    (sticky sessions), where their shared prefixes are cached. The reply keeps the exact prompt ids sent and the
    server's output: the call's training row is built from them (:meth:`AgentRollout.outputs`)."""

    def __init__(self, rollout: AgentRollout, server: Any, request_id: str, sampling_params: dict[str, Any]) -> None:
        self.rollout = rollout
        self.server = server
        self.request_id = request_id
        self.sampling_params = sampling_params

    async def chat(
        self, messages: list[dict[str, str]], max_tokens: int, *, prompt_ids: list[int] | None = None, **sampling: Any
    ) -> Reply:
        params = call_sampling_params(self.sampling_params, sampling)
        if prompt_ids is None:
            prompt_ids = self.rollout.render(messages)
        return await self.rollout.call(self.server, self.request_id, list(prompt_ids), max_tokens, params)


class AgentRollout:
    """Per-process state of the rollout: the agent (built once), budgets and end ids. Get it with :meth:`get`
    (cached per config and tokenizer)."""

    _instances: dict[tuple[int, str, Budgets, float], AgentRollout] = {}

    def __init__(self, settings: RecurrentSettings, tokenizer: Any, budgets: Budgets, temperature: float = 1.0) -> None:
        self.settings = settings
        self.tokenizer = tokenizer
        self.budgets = budgets
        self.temperature = temperature  # the rollout's: a row's temperature where its call set none
        self.agent = build_agent(settings, tokenizer)
        check_budgets(self.agent, budgets)
        register = load_register(settings.agent)
        self.source = register.source  # the agent's own function: failures are named at its lines
        # Columns not copied into the stored rows (the memory agent's document).
        self.large_columns = register.large_columns_of(self.agent.config)
        self.end_ids = end_token_ids(tokenizer)
        # Every trajectory's, in both modes (verl_ext/trajectory_deadline.py); None: no limit.
        self.deadline = trajectory_deadline(settings.trajectory_timeout_s, settings.mode)
        # One thread builds episodes (a long document is tokenized there): off the event loop, never two at once.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="recurrent-episode")

    @classmethod
    def get(cls, config: DictConfig, tokenizer: Any) -> AgentRollout:
        settings = recurrent_settings(config)
        rollout = config.actor_rollout_ref.rollout
        budgets = Budgets(int(rollout.prompt_length), int(rollout.response_length))
        temperature = float(rollout.temperature)
        agent = json.dumps([settings.agent, settings.agent_config], sort_keys=True, default=str)
        key = (id(tokenizer), agent, budgets, temperature)
        if key not in cls._instances:
            cls._instances[key] = cls(settings, tokenizer, budgets, temperature)
        return cls._instances[key]

    # ---- episodes ----

    async def episode(self, sample: dict[str, Any]) -> Episode:
        """The episode of one trajectory, built in the rollout's worker thread; it runs within :attr:`deadline`
        (verl_ext/trajectory_deadline.py)."""
        episode = await asyncio.get_running_loop().run_in_executor(self._executor, self.agent.episode, sample)
        if isinstance(episode, FunctionEpisode):  # a prompt it renders itself is held to the row's width
            episode.max_prompt_tokens = self.budgets.prompt_length
        return episode

    def render(self, messages: list[dict[str, str]]) -> list[int]:
        """A call's messages as the policy sees them (:func:`recurrent.templating.chat_prompt_ids`); a prompt whose
        text cannot fit ``rollout.prompt_length`` is refused before it is tokenized."""
        return chat_prompt_ids(self.tokenizer, messages, max_tokens=self.budgets.prompt_length)

    # ---- one model call ----

    def reply(self, output: TokenOutput, prompt_ids: list[int], max_tokens: int, seconds: float) -> Reply:
        """The server's answer as a :class:`Reply` (its ids become, for the memory agent, the next memory)."""
        if output.stop_reason in ("aborted", "abort"):
            raise RuntimeError("the rollout server aborted an agent's request (partial rollout is not supported)")
        ids = list(output.token_ids)
        if not ids:
            raise RuntimeError("the rollout server returned no tokens for an agent's call")
        if len(ids) > max_tokens:
            raise RuntimeError(f"the server returned {len(ids)} tokens for a call capped at {max_tokens}")
        return Reply(
            text=self.tokenizer.decode(ids, skip_special_tokens=True),
            finish_reason=finish_reason(ids, max_tokens, self.end_ids),
            token_ids=ids,
            prompt_tokens=len(prompt_ids),
            completion_tokens=len(ids),
            seconds=seconds,
            prompt_ids=prompt_ids,
            backend_output=output,
        )

    async def call(
        self, server: Any, request_id: str, prompt_ids: list[int], max_tokens: int, sampling_params: dict[str, Any]
    ) -> Reply:
        """One call through ``server.generate`` with the call's own ``max_tokens``."""
        # A call that does not fit would be cut by verl's row layout and train on a corrupted row: refused here
        # (check_budgets makes it impossible for an agent that declares its row widths).
        if len(prompt_ids) > self.budgets.prompt_length:
            raise ValueError(
                f"a call prompt of {len(prompt_ids)} tokens exceeds rollout.prompt_length={self.budgets.prompt_length}"
            )
        if max_tokens > self.budgets.response_length:
            raise ValueError(
                f"a call's max_tokens={max_tokens} exceeds rollout.response_length={self.budgets.response_length}"
            )
        start = time.perf_counter()
        output: TokenOutput = await server.generate(
            request_id=request_id, prompt_ids=prompt_ids, sampling_params={**sampling_params, "max_tokens": max_tokens}
        )
        return self.reply(output, prompt_ids, max_tokens, time.perf_counter() - start)

    # ---- a finished episode as verl rows ----

    def outputs(self, episode: Episode, want_logprobs: bool) -> list[RowOutput]:
        """One :class:`RowOutput` per model call, in the episode's order; the last is the answer.

        Every generated token is trained on (``response_mask`` all ones): what a call's prompt holds (earlier
        replies, tool results, a document's chunk) is never trained on. ``num_turns`` is the episode's number of
        calls on every row. The weight-version tags cover the whole trajectory. A call's own sampling is in its
        row's extra fields (``temperature``, ``top_p``) and its temperature in the row's ``temperature``.
        """
        check_finished(episode)  # also: its answer is its last call's reply (docs/write_your_own_agent.md)
        history = episode.history
        outputs_of = [record.reply.backend_output for record in history]
        if any(out is None for out in outputs_of):
            raise RuntimeError("a call of the episode did not go through the rollout's token server")
        steps = [out.extra_fields.get("global_steps") for out in outputs_of]
        known = [s for s in steps if s is not None]
        min_steps, max_steps = (min(known), max(known)) if known else (None, None)
        last = len(history) - 1
        outputs = []
        for index, (record, out) in enumerate(zip(history, outputs_of, strict=True)):
            ids = list(record.reply.token_ids)
            logprobs = None
            if want_logprobs:
                if out.log_probs is None or len(out.log_probs) != len(ids):
                    raise RuntimeError("the rollout server did not return one log-prob per generated token")
                logprobs = list(out.log_probs)
            meta = record.turn.meta
            extra = {
                **{k: v for k, v in out.extra_fields.items() if k in ("num_cached_tokens",)},
                "turn_index": index,
                "turn_kind": turn_kind(record, index == last),
                "chunk": int(meta.get("chunk", -1)),
                "max_tokens": record.turn.max_tokens,
                "finish_reason": record.reply.finish_reason,
                # only on the rows of openai-client requests: the memory agent's rows stay as they were
                **{k: v for k, v in made_by(record).items() if v is not None},
                "global_steps": steps[index],
                "min_global_steps": min_steps,
                "max_global_steps": max_steps,
                **record.turn.sampling,
            }
            outputs.append(
                RowOutput(
                    prompt_ids=list(record.reply.prompt_ids),
                    response_ids=ids,
                    response_mask=[1] * len(ids),
                    response_logprobs=logprobs,
                    num_turns=len(history),
                    metrics=AgentLoopMetrics(
                        generate_sequences=record.reply.seconds,
                        num_preempted=out.num_preempted if out.num_preempted is not None else -1,
                    ),
                    extra_fields=extra,
                    temperature=float(record.turn.sampling.get("temperature", self.temperature)),
                )
            )
        outputs[-1].trajectory = [call_view(record, index == last) for index, record in enumerate(history)]
        outputs[-1].agent_score = episode.score
        return outputs


def episode_stats(outputs: list[AgentLoopOutput]) -> dict[str, float]:
    """Per-trajectory statistics of the calls before the answer (added to the final row's ``reward_extra_info``,
    so that verl's validation reports them per data source; the same keys for every trajectory, as verl's
    aggregation needs): ``calls`` (how many), ``call_tokens`` (their mean response length) and ``call_truncated``
    (the share cut at their cap). For the memory agent these are its memory updates."""
    calls = outputs[:-1]
    lengths = [len(o.response_ids) for o in calls]
    truncated = [o.extra_fields.get("finish_reason") == "length" for o in calls]
    return {
        "calls": float(len(calls)),
        "call_tokens": float(np.mean(lengths)) if lengths else 0.0,
        "call_truncated": float(np.mean(truncated)) if truncated else 0.0,
    }
