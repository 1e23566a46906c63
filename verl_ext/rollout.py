"""The memory agent on verl's rollout API: one ``recurrent`` session per trajectory, one row per turn.

This module is the only glue between the workflow (``recurrent/``, where prompts, chunking and the memory
overwrite live) and verl: it builds the workflow from ``config.recurrent``, checks its token budgets
against ``rollout.prompt_length`` / ``rollout.response_length``, turns a session's turns into calls of
verl's token-in/token-out server (``server.generate(request_id, prompt_ids=..., sampling_params=...)``)
and a finished session into ``list[AgentLoopOutput]``: one output per memory-update turn, then the final
answer. Both rollout modes use it: :mod:`verl_ext.agent_loop` (async, one coroutine per trajectory) and
:mod:`verl_ext.lockstep` (sync, all trajectories of a batch one turn at a time).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
from omegaconf import DictConfig, OmegaConf
from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput
from verl.workers.rollout.replica import TokenOutput

from recurrent.impls.memory import MemoryConfig, MemoryWorkflow
from recurrent.interface import Reply, Session, load_register
from recurrent.tokens import encode_long, end_token_ids

MODES = ("async", "sync")
CONTEXT_CACHE_SIZE = 256  # tokenized contexts kept per process (n sessions of a prompt tokenize once)


@dataclass(frozen=True)
class Budgets:
    """verl's per-row widths: every turn's prompt and response must fit (``rollout.prompt_length`` is
    ``data.max_prompt_length`` and sizes vLLM's ``max_model_len`` together with ``response_length``)."""

    prompt_length: int
    response_length: int


def recurrent_section(config: DictConfig) -> dict[str, Any]:
    """``config.recurrent`` as a plain dict, with its mode checked."""
    section = OmegaConf.to_container(config.recurrent, resolve=True)
    mode = section.get("mode", "async")
    if mode not in MODES:
        raise ValueError(f"recurrent.mode must be one of {MODES}, got {mode!r}")
    return section


def build_workflow(section: dict[str, Any], tokenizer: Any) -> MemoryWorkflow:
    """The workflow named by ``recurrent.workflow`` with ``recurrent.config`` (token-space prompts)."""
    register = load_register(section.get("workflow", "recurrent.impls.memory"))
    workflow_config = register.config_cls(**(section.get("config") or {}))
    return register.workflow_cls(workflow_config, tokenizer, token_prompts=True)


def check_budgets(workflow: MemoryWorkflow, budgets: Budgets) -> None:
    """Raise a ValueError naming the budgets when some turn could not fit verl's row widths.

    In the fork such a turn widened one round's tensors and broke their concatenation; here the mismatch is
    found before the run. The question budget is ``recurrent.config.max_prompt_length``, not
    ``data.max_prompt_length`` (verl's row width)."""
    cfg: MemoryConfig = workflow.config
    prompt, response = workflow.max_turn_lengths()
    problems = []
    if prompt > budgets.prompt_length:
        problems.append(
            f"the longest turn prompt is {prompt} tokens (chat template + instruction "
            f"{workflow.memory_ids_template.length}, question recurrent.config.max_prompt_length="
            f"{cfg.max_prompt_length}, chunk recurrent.config.chunk_size={cfg.chunk_size}, memory "
            f"recurrent.config.max_memorization_length={cfg.max_memorization_length}) but "
            f"actor_rollout_ref.rollout.prompt_length (data.max_prompt_length) is {budgets.prompt_length}"
        )
    if response > budgets.response_length:
        problems.append(
            f"a turn may generate {response} tokens (recurrent.config.max_memorization_length="
            f"{cfg.max_memorization_length}, max_final_response_length={cfg.max_final_response_length}) but "
            f"actor_rollout_ref.rollout.response_length (data.max_response_length) is {budgets.response_length}"
        )
    if problems:
        raise ValueError("memory agent budgets do not fit verl's rollout widths: " + "; ".join(problems))


def finish_reason(token_ids: list[int], max_tokens: int, end_ids: frozenset[int]) -> str:
    """The finish reason of a call: "length" when it used its whole budget without ending on an end token
    (:func:`recurrent.tokens.end_token_ids`), else "stop" (verl's servers report "completed" for both)."""
    if len(token_ids) >= max_tokens and (not token_ids or token_ids[-1] not in end_ids):
        return "length"
    return "stop"


class MemoryRollout:
    """Per-process state of the memory agent rollout: the workflow (built once), budgets, end ids and a
    small cache of tokenized contexts. Get it with :meth:`get` (cached per config and tokenizer)."""

    _instances: dict[tuple[int, str, Budgets], MemoryRollout] = {}

    def __init__(self, section: dict[str, Any], tokenizer: Any, budgets: Budgets) -> None:
        self.tokenizer = tokenizer
        self.budgets = budgets
        self.workflow = build_workflow(section, tokenizer)
        check_budgets(self.workflow, budgets)
        self.end_ids = end_token_ids(tokenizer)
        # One thread tokenizes long contexts: off the event loop, never two encodes at once on one tokenizer.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="memagent-tokenize")
        self._contexts: OrderedDict[tuple[str, int], np.ndarray] = OrderedDict()

    @classmethod
    def get(cls, config: DictConfig, tokenizer: Any) -> MemoryRollout:
        section = recurrent_section(config)
        rollout = config.actor_rollout_ref.rollout
        budgets = Budgets(int(rollout.prompt_length), int(rollout.response_length))
        key = (id(tokenizer), json.dumps(section, sort_keys=True, default=str), budgets)
        if key not in cls._instances:
            cls._instances[key] = cls(section, tokenizer, budgets)
        return cls._instances[key]

    # ---- sessions ----

    async def session(self, sample: dict[str, Any]) -> Session:
        """A session for one trajectory; the context of a prompt (keyed by its ``uid``) is tokenized once."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, self._session, sample)

    def _session(self, sample: dict[str, Any]) -> Session:
        context = self.workflow.context_text(sample)
        key = (str(sample.get("uid")), len(context))
        ids = self._contexts.get(key) if "uid" in sample else None
        if ids is None:
            ids = encode_long(context, self.tokenizer)
            if "uid" in sample:
                self._contexts[key] = ids
                while len(self._contexts) > CONTEXT_CACHE_SIZE:
                    self._contexts.popitem(last=False)
        return self.workflow.session(sample, context_ids=ids)

    # ---- one model call ----

    def reply(self, output: TokenOutput, prompt_ids: list[int], max_tokens: int, seconds: float) -> Reply:
        """The server's answer as a :class:`Reply` for the session (its ids become the next memory)."""
        if output.stop_reason in ("aborted", "abort"):
            raise RuntimeError("the rollout server aborted a memory agent request (partial rollout is not supported)")
        ids = list(output.token_ids)
        if not ids:
            raise RuntimeError("the rollout server returned no tokens for a memory agent turn")
        if len(ids) > max_tokens:
            raise RuntimeError(f"the server returned {len(ids)} tokens for a turn capped at {max_tokens}")
        return Reply(
            text=self.tokenizer.decode(ids, skip_special_tokens=True),
            finish_reason=finish_reason(ids, max_tokens, self.end_ids),
            token_ids=ids,
            prompt_tokens=len(prompt_ids),
            completion_tokens=len(ids),
            seconds=seconds,
        )

    async def call(
        self, server: Any, request_id: str, prompt_ids: list[int], max_tokens: int, sampling_params: dict[str, Any]
    ) -> tuple[TokenOutput, Reply]:
        """One turn through ``server.generate`` with the turn's own ``max_tokens``."""
        # check_budgets makes both impossible; kept as guards because a violation would corrupt rows silently.
        if len(prompt_ids) > self.budgets.prompt_length:
            raise ValueError(
                f"turn prompt of {len(prompt_ids)} tokens exceeds rollout.prompt_length={self.budgets.prompt_length}"
            )
        if max_tokens > self.budgets.response_length:
            raise ValueError(
                f"turn max_tokens={max_tokens} exceeds rollout.response_length={self.budgets.response_length}"
            )
        start = time.perf_counter()
        output: TokenOutput = await server.generate(
            request_id=request_id, prompt_ids=prompt_ids, sampling_params={**sampling_params, "max_tokens": max_tokens}
        )
        return output, self.reply(output, prompt_ids, max_tokens, time.perf_counter() - start)

    # ---- a finished session as verl rows ----

    def outputs(self, session: Session, token_outputs: list[TokenOutput], want_logprobs: bool) -> list[AgentLoopOutput]:
        """One :class:`AgentLoopOutput` per turn, in session order (memory turns, then the final answer).

        Every generated token is trained on (``response_mask`` all ones). ``num_turns`` is the session's
        number of model calls on every row. The weight-version tags cover the whole trajectory.
        """
        history = session.history
        if len(history) != len(token_outputs):
            raise AssertionError(f"{len(history)} turns but {len(token_outputs)} server outputs")
        if not history or not history[-1].turn.final:
            raise RuntimeError("the session did not end with its final answer turn")
        steps = [o.extra_fields.get("global_steps") for o in token_outputs]
        known = [s for s in steps if s is not None]
        min_steps, max_steps = (min(known), max(known)) if known else (None, None)
        outputs = []
        for index, (record, out) in enumerate(zip(history, token_outputs, strict=True)):
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
                "turn_kind": meta.get("kind", "final" if record.turn.final else "memory"),
                "chunk": int(meta.get("chunk", -1)),
                "max_tokens": record.turn.max_tokens,
                "finish_reason": record.reply.finish_reason,
                "global_steps": steps[index],
                "min_global_steps": min_steps,
                "max_global_steps": max_steps,
            }
            outputs.append(
                AgentLoopOutput(
                    prompt_ids=list(record.turn.prompt_ids),
                    response_ids=ids,
                    response_mask=[1] * len(ids),
                    response_logprobs=logprobs,
                    num_turns=len(history),
                    metrics=AgentLoopMetrics(
                        generate_sequences=record.reply.seconds,
                        num_preempted=out.num_preempted if out.num_preempted is not None else -1,
                    ),
                    extra_fields=extra,
                )
            )
        return outputs


def session_stats(outputs: list[AgentLoopOutput]) -> dict[str, float]:
    """Per-trajectory memory statistics (added to the final row's ``reward_extra_info`` so that verl's
    validation reports them per data source): memory turns, mean memory length, share truncated."""
    memory = [o for o in outputs if o.extra_fields.get("turn_kind") == "memory"]
    lengths = [len(o.response_ids) for o in memory]
    truncated = [o.extra_fields.get("finish_reason") == "length" for o in memory]
    return {
        "memory_turns": float(len(memory)),
        "memory_tokens": float(np.mean(lengths)) if lengths else 0.0,
        "memory_truncated": float(np.mean(truncated)) if truncated else 0.0,
    }
