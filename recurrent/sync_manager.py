"""Sync mode: all samples of a batch advance one turn at a time, in lockstep, through a token backend.

:class:`SessionBatchAgent` turns per-sample :class:`~recurrent.interface.Session` objects into a batch-level
:class:`~recurrent.interface.RAgent`; :class:`SyncGenerationManager` drives any ``RAgent`` round by round
through a backend with verl's ``generate_sequences(DataProto) -> DataProto`` shape and returns every
generated row, turn-major, ready for training (spec 2.2)::

    gen         = [s1_t1, s2_t1, s3_t1, s4_t1, s1_t2, s3_t2, s3_t3, s1_F, s2_F, s3_F, s4_F]
    final_mask  = [F,     F,     F,     F,     F,     F,     F,     T,    T,    T,    T   ]
    sample_index= [0,     1,     2,     3,     0,     2,     2,     0,    1,    2,    3   ]

Rows are never reordered afterwards (spec P11): ``final_mask`` and ``sample_index`` are positional.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from verl import DataProto

from recurrent.interface import RAgent, Reply, Session, Turn
from recurrent.padding import graceful_padding, pad_tensor_list_to_length, position_ids_from_mask, rollout_tensors

PADDING_WORD = "Hello."  # the dummy prompt that fills a round up to a multiple of world_size (spec 2.2)


class GenerationBackend(Protocol):
    """verl's rollout-worker shape (``recurrent.backends.hf.HFBackend`` on CPU, verl's worker group on GPU)."""

    def generate_sequences(self, prompts: DataProto) -> DataProto: ...


# --------------------------------------------------------------------------------------------------------
# Sessions -> a batch-level agent
# --------------------------------------------------------------------------------------------------------


def last_row_mask(sample_index: torch.Tensor) -> torch.Tensor:
    """True on the last row of each sample: the row its reward is computed on (a session's last turn)."""
    rows = torch.arange(len(sample_index))
    last = torch.full((int(sample_index.max()) + 1 if len(sample_index) else 0,), -1, dtype=torch.long)
    last.scatter_reduce_(0, sample_index, rows, reduce="amax")
    return rows == last[sample_index]


class SessionBatchAgent(RAgent):
    """Run one :class:`Session` per sample in lockstep.

    Each round, every session whose pending turn is not final contributes it; final turns wait until no
    session has a non-final turn left and then all go in one last round. This is the spec's turn-major
    order: a batch runs ``max(#memory turns) + 1`` rounds.
    """

    def __init__(self, make_session: Callable[[dict[str, Any]], Session] | Any) -> None:
        """``make_session``: a workflow (anything with ``.session(sample)``) or a function ``sample -> Session``."""
        self.make_session = getattr(make_session, "session", make_session)
        self.sessions: list[Session] = []
        self._pending: list[Turn | None] = []
        self._active: list[int] = []

    def start(self, batch: list[dict[str, Any]]) -> None:
        self.sessions = [self.make_session(sample) for sample in batch]
        self._pending = [self._next(i) for i in range(len(self.sessions))]
        self._active = []

    def _next(self, i: int) -> Turn | None:
        turn = self.sessions[i].next_turn()
        if turn is not None and turn.prompt_ids is None:
            raise ValueError(
                f"session {i} ({type(self.sessions[i]).__name__}) returned a Turn without prompt_ids; "
                "sync mode generates from token ids, so the workflow must build them"
            )
        return turn

    def action(self) -> tuple[list[torch.Tensor], dict[str, Any]]:
        waiting = [i for i, t in enumerate(self._pending) if t is not None]
        non_final = [i for i in waiting if not self._pending[i].final]
        self._active = non_final or waiting  # finals only once every memory turn is done
        if not self._active:
            raise RuntimeError("action() called after every session finished")
        turns = [self._pending[i] for i in self._active]
        budgets = sorted({t.max_tokens for t in turns})
        if len(budgets) > 1:
            raise ValueError(
                f"the turns of one round must share max_tokens, got {budgets} "
                f"(samples {self._active}); sync mode generates a round as one batch"
            )
        prompts = [torch.tensor(t.prompt_ids, dtype=torch.long) for t in turns]
        meta = {
            "sample_index": torch.tensor(self._active, dtype=torch.long),
            "final_mask": torch.tensor([t.final for t in turns], dtype=torch.bool),
            "max_tokens": budgets[0],
        }
        return prompts, meta

    def update(self, responses: list[Reply]) -> None:
        if len(responses) != len(self._active):
            raise ValueError(f"got {len(responses)} replies for {len(self._active)} prompts")
        for i, reply in zip(self._active, responses, strict=True):
            self.sessions[i].record(reply)
        for i in self._active:
            self._pending[i] = self._next(i)
        self._active = []

    def drop(self, i: int) -> None:
        """Take sample ``i`` out of the lockstep (its model call failed): it gets no further turns, and the
        other samples' rounds go on without it."""
        self._pending[i] = None
        if i in self._active:
            self._active.remove(i)

    def done(self) -> bool:
        return all(t is None for t in self._pending)

    def end(self) -> list[Session] | None:
        sessions, self.sessions, self._pending, self._active = self.sessions, [], [], []
        return sessions


# --------------------------------------------------------------------------------------------------------
# The lockstep loop
# --------------------------------------------------------------------------------------------------------


@dataclass
class SyncRollout:
    """Every generated row of a batch, turn-major, with its bookkeeping."""

    rows: DataProto  # prompts, responses, input_ids, attention_mask, position_ids, response_mask
    final_mask: torch.Tensor  # bool per row: the answer turn of its sample
    sample_index: torch.Tensor  # long per row: the sample (batch row) it belongs to
    sessions: list[Session] | None = None
    timings: list[dict[str, Any]] = field(default_factory=list)  # per round: rows, max_tokens, seconds per phase

    def timing_totals(self) -> dict[str, float]:
        """Seconds per phase summed over rounds (``mt_prepare``, ``mt_gen``, ``mt_update``), as verl logs them."""
        keys = ("mt_prepare", "mt_gen", "mt_update")
        return {k: sum(r[k] for r in self.timings) for k in keys}


@dataclass
class _Round:
    prompts: list[torch.Tensor]  # unpadded
    output: DataProto  # the backend's output, dummies removed
    final_mask: torch.Tensor
    sample_index: torch.Tensor


class SyncGenerationManager:
    """Drive an :class:`RAgent` round by round through ``backend.generate_sequences``.

    ``input_pad_to`` / ``pad_to`` are minimum prompt / response widths. Rounds are generated at their own
    widths and re-padded at the end to one common width (the max over all rounds), so rounds with a longer
    question or a larger ``max_tokens`` cannot break the concatenation (spec P2).
    """

    def __init__(
        self,
        backend: GenerationBackend,
        tokenizer: Any,
        world_size: int = 1,
        input_pad_to: int | None = None,
        pad_to: int | None = None,
    ) -> None:
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        self.backend = backend
        self.tokenizer = tokenizer
        self.world_size = world_size
        self.input_pad_to = input_pad_to or 0
        self.pad_to = pad_to
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": PADDING_WORD}], add_generation_prompt=True, tokenize=False
        )
        self.padding_ids = torch.tensor(tokenizer.encode(text, add_special_tokens=False), dtype=torch.long)

    def _eos_ids(self, meta: dict[str, Any]) -> set[int]:
        eos = meta.get("eos_token_id", self.tokenizer.eos_token_id)
        return {int(eos)} if isinstance(eos, int) else {int(e) for e in eos}

    def run(
        self, agent: RAgent, batch: list[dict[str, Any]], generation_kwargs: dict[str, Any] | None = None
    ) -> SyncRollout:
        """Run ``agent`` over ``batch`` to the end; ``generation_kwargs`` go into every round's ``meta_info``
        (``do_sample``, ``temperature``, ``top_p``, ``eos_token_id``, ``pad_token_id``, ``validate``, ...)."""
        extra = dict(generation_kwargs or {})
        agent.start(batch)
        rounds: list[_Round] = []
        timings: list[dict[str, Any]] = []
        while not agent.done():
            t0 = time.perf_counter()
            prompts, meta = agent.action()
            if not prompts or len(prompts) != len(meta["sample_index"]) or len(prompts) != len(meta["final_mask"]):
                raise ValueError(
                    f"action() returned {len(prompts)} prompts, {len(meta['sample_index'])} sample indices and "
                    f"{len(meta['final_mask'])} final flags; they must match and be non-empty"
                )
            max_tokens = int(meta["max_tokens"])
            round_pad_to = self.pad_to if self.pad_to is not None else max_tokens
            if round_pad_to < max_tokens:
                raise ValueError(f"pad_to ({round_pad_to}) is smaller than this round's max_tokens ({max_tokens})")
            gen_meta = {**extra, "max_tokens": max_tokens, "pad_to": round_pad_to}
            t1 = time.perf_counter()
            output = self._generate(prompts, gen_meta)
            t2 = time.perf_counter()
            replies = self._replies(prompts, output, self._eos_ids(gen_meta), seconds=t2 - t1)
            agent.update(replies)
            t3 = time.perf_counter()
            rounds.append(_Round(prompts, output, meta["final_mask"].bool(), meta["sample_index"].long()))
            timings.append(
                {"rows": len(prompts), "final": bool(meta["final_mask"].all()), "max_tokens": max_tokens,
                 "mt_prepare": t1 - t0, "mt_gen": t2 - t1, "mt_update": t3 - t2}
            )  # fmt: skip
        sessions = agent.end()
        if not rounds:
            raise ValueError("the agent was done before its first round")

        rows = self._concat(rounds)
        flagged = torch.cat([r.final_mask for r in rounds])
        sample_index = torch.cat([r.sample_index for r in rounds])
        final_mask = last_row_mask(sample_index)
        counts = torch.bincount(sample_index, minlength=len(batch))
        if len(counts) != len(batch) or not bool((counts > 0).all()):
            raise AssertionError(f"expected at least one row per sample, got counts {counts.tolist()}")
        if bool((flagged & ~final_mask).any()):  # a turn flagged final in advance must be its sample's last
            raise AssertionError("a row flagged final is not the last row of its sample")
        return SyncRollout(rows, final_mask, sample_index, sessions, timings)

    def _generate(self, prompts: list[torch.Tensor], meta: dict[str, Any]) -> DataProto:
        """One round through the backend, padded with dummy rows to a multiple of world_size (spec 2.2, P10)."""
        bsz = len(prompts)
        padding_index, no_padding_mask = graceful_padding(bsz, self.world_size)
        needs_dummies = bool((padding_index < 0).any())
        rows = [*prompts, self.padding_ids] if needs_dummies else prompts
        ids, mask = pad_tensor_list_to_length(rows, self.pad_id, max_length=self.input_pad_to, return_mask=True)
        if needs_dummies:
            order = torch.where(padding_index < 0, bsz, padding_index)  # the dummy is the row after the real ones
            ids, mask = ids[order], mask[order]
        batch = DataProto.from_dict(
            tensors={"input_ids": ids, "attention_mask": mask.long(), "position_ids": position_ids_from_mask(mask)},
            meta_info=meta,
        )
        output = self.backend.generate_sequences(batch)
        if len(output) != len(ids):
            raise AssertionError(f"the backend returned {len(output)} rows for {len(ids)}")
        return output[no_padding_mask] if needs_dummies else output

    def _replies(
        self, prompts: list[torch.Tensor], output: DataProto, eos_ids: set[int], seconds: float
    ) -> list[Reply]:
        responses = output.batch["responses"]
        mask = self._response_mask(output)
        replies = []
        for prompt, row, row_mask in zip(prompts, responses, mask, strict=True):
            ids = row[row_mask.bool()].tolist()  # up to and including the first eos; trailing pads dropped
            stopped = bool(ids) and ids[-1] in eos_ids
            replies.append(
                Reply(
                    text=self.tokenizer.decode(ids, skip_special_tokens=True),
                    finish_reason="stop" if stopped else "length",
                    token_ids=ids,
                    prompt_tokens=len(prompt),
                    completion_tokens=len(ids),
                    seconds=seconds,  # lockstep: every call of the round waited for the whole round
                )
            )
        return replies

    @staticmethod
    def _response_mask(output: DataProto) -> torch.Tensor:
        """The backend's ``response_mask``, else the response half of its attention mask (verl's rollouts)."""
        if "response_mask" in list(output.batch.keys()):  # TensorDict has no `in`
            return output.batch["response_mask"].long()
        width = output.batch["responses"].shape[1]
        return output.batch["attention_mask"][:, -width:].long()

    def _concat(self, rounds: list[_Round]) -> DataProto:
        """All rounds as one turn-major batch, re-padded to one prompt width and one response width."""
        prompt_width = max([self.input_pad_to, *(len(p) for r in rounds for p in r.prompts)])
        response_width = max(r.output.batch["responses"].shape[1] for r in rounds)
        prompts = [p for r in rounds for p in r.prompts]
        prompt_ids, prompt_mask = pad_tensor_list_to_length(
            prompts, self.pad_id, max_length=prompt_width, return_mask=True
        )
        responses = pad_tensor_list_to_length(
            [row for r in rounds for row in r.output.batch["responses"]],
            self.pad_id,
            max_length=response_width,
            left_pad=False,
        )
        response_mask = pad_tensor_list_to_length(
            [row for r in rounds for row in self._response_mask(r.output)], 0, response_width, left_pad=False
        )
        responses = responses.masked_fill(response_mask == 0, self.pad_id)
        tensors = rollout_tensors(
            prompt_ids, prompt_mask, position_ids_from_mask(prompt_mask), responses, response_mask
        )
        return DataProto.from_dict(tensors=tensors)
