"""A token-in/token-out generation server around a ``transformers`` causal LM, for CPU.

It has the coroutine API of verl's rollout servers (``vllm_async_server.py``) and of ``LLMServerClient``::

    await server.generate(request_id, prompt_ids=[...], sampling_params={...}) -> TokenOutput

so the memory agent loop can be driven by it directly (tests, in-process) or, wrapped as a Ray actor
(``ray.remote(HFTokenServer)``), behind verl's load balancer and ``LLMServerClient`` (the CPU trainer).
Semantics follow the vLLM adapter: ``max_tokens`` caps new tokens, the returned ids include the eos token
when one was generated, ``temperature == 0`` is greedy, ``top_k == -1`` is "off", and ``logprobs`` asks for
the log-probability of each generated token (under the temperature-scaled distribution, like vLLM's
``processed_logprobs``).

Batching. Requests queue in arrival order and one worker task serves them, one ``model.generate`` call at a
time (in a thread, so the event loop stays free). A call takes the oldest queued request and every queued
request that shares its sampling (greedy, or the same temperature / top_p / top_k; the same
repetition_penalty), up to ``max_batch_size``: requests that arrive while a call runs go into the next one.
The prompts are left-padded under an attention mask (transformers derives the position ids from it, so a row
gets the tokens and log-probs it would get alone, up to float rounding), the call generates up to the largest
``max_tokens`` of the batch, and each request gets its own first ``max_tokens`` tokens, cut after its first
eos, with the log-probs of exactly those. A request with a ``seed`` runs alone, so its seeded result stays
reproducible. A call of several rows reads the prompts in chunks of ``prefill_chunk_size`` positions
(transformers' chunked prefill; in one pass the prompts' attention scores are rows x heads x width^2 floats;
``None``: one pass). ``max_batch_size=1`` serves one request per call, in arrival order, as before batching.
``around_batch`` (an async context manager factory) is entered around each call: ``HFCPUServer`` holds its model
lock there, so a weight update never interleaves with a generation, and a request queued across an update is
generated after it.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

import torch
from verl.workers.rollout.replica import TokenOutput

DEFAULT_MAX_TOKENS = 512
DEFAULT_MAX_BATCH_SIZE = 64
DEFAULT_PREFILL_CHUNK = 128


@dataclass
class _Request:
    prompt_ids: list[int]
    max_tokens: int
    params: dict[str, Any]
    key: tuple | None  # requests with equal keys share a model.generate call; None: the request runs alone
    future: asyncio.Future


class HFTokenServer:
    """Generate with a Hugging Face causal LM in this process (or in a Ray actor)."""

    def __init__(
        self,
        model: str | os.PathLike[str] | Any,
        tokenizer: Any = None,
        dtype: torch.dtype = torch.float32,
        device: str = "cpu",
        max_model_len: int | None = None,
        max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
        around_batch: Callable[[], AbstractAsyncContextManager[Any]] | None = None,
        prefill_chunk_size: int | None = DEFAULT_PREFILL_CHUNK,
    ) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if isinstance(model, str | os.PathLike):
            tokenizer = tokenizer or AutoTokenizer.from_pretrained(model)
            model = AutoModelForCausalLM.from_pretrained(model, dtype=dtype)
        if tokenizer is None:
            raise ValueError("HFTokenServer needs a tokenizer when given a model object")
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self.model = model.to(device).eval()
        self.tokenizer = tokenizer
        self.device = torch.device(device)
        self.max_model_len = max_model_len
        self.max_batch_size = max_batch_size
        self.around_batch = around_batch
        self.prefill_chunk_size = prefill_chunk_size
        self.global_steps = 0  # the weight version, as verl's servers report it (extra_fields)
        generation_eos = getattr(model.generation_config, "eos_token_id", None)
        eos = generation_eos if isinstance(generation_eos, list) else [generation_eos]
        self.eos_ids = sorted({int(e) for e in [*eos, tokenizer.eos_token_id] if e is not None})
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_ids[0]
        self._queue: list[_Request] = []
        self._worker: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.requests = 0  # requests served
        self.generate_calls = 0  # model.generate calls (batches)

    def queued(self) -> int:
        """Requests waiting for a model.generate call (not counting the one running)."""
        return len(self._queue)

    async def drain(self) -> None:
        """Returns once every queued request has been served (in this event loop)."""
        while self._loop is asyncio.get_running_loop() and self._worker is not None and not self._worker.done():
            await asyncio.shield(self._worker)

    async def generate(
        self,
        request_id: str,
        *,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        image_data: Any = None,
        video_data: Any = None,
        **kwargs: Any,
    ) -> TokenOutput:
        if image_data is not None or video_data is not None or kwargs.get("audio_data") is not None:
            raise NotImplementedError("HFTokenServer serves text-only models")
        params = dict(sampling_params)
        max_tokens = int(params.pop("max_tokens", params.pop("max_new_tokens", DEFAULT_MAX_TOKENS)))
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        if not prompt_ids:
            raise ValueError("prompt_ids must not be empty")
        if self.max_model_len is not None and len(prompt_ids) + max_tokens > self.max_model_len:
            raise ValueError(
                f"prompt ({len(prompt_ids)} tokens) + max_tokens ({max_tokens}) exceeds max_model_len "
                f"({self.max_model_len})"
            )
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # futures and tasks belong to one event loop (a Ray actor has one)
            self._queue, self._worker, self._loop = [], None, loop
        key = None if params.get("seed") is not None else self._sampling(params)
        request = _Request([int(t) for t in prompt_ids], max_tokens, params, key, loop.create_future())
        self._queue.append(request)
        if self._worker is None or self._worker.done():
            self._worker = loop.create_task(self._work())
        token_ids, log_probs, global_steps = await request.future
        return TokenOutput(
            token_ids=token_ids,
            log_probs=log_probs if params.get("logprobs") else None,
            stop_reason="completed",
            num_preempted=0,
            extra_fields={"global_steps": global_steps},
        )

    @staticmethod
    def _sampling(params: dict[str, Any]) -> tuple:
        """What a model.generate call fixes for all its rows: greedy or the sampling parameters, and the
        repetition penalty (log-probs are scaled by the temperature only when sampling)."""
        temperature = float(params.get("temperature", 1.0))
        repetition_penalty = float(params.get("repetition_penalty", 1.0))
        if temperature <= 0.0 or params.get("do_sample") is False:
            return ("greedy", repetition_penalty)
        top_k = max(0, int(params.get("top_k", -1)))  # vLLM's -1 ("off") is HF's 0
        return ("sample", repetition_penalty, temperature, float(params.get("top_p", 1.0)), top_k)

    def _take_batch(self) -> list[_Request]:
        """The oldest queued request and the queued requests that can share its call (in arrival order)."""
        self._queue = [r for r in self._queue if not r.future.done()]  # callers that gave up (cancelled)
        if not self._queue:
            return []
        first = self._queue[0]
        if first.key is None:
            batch = [first]
        else:
            batch = [r for r in self._queue if r.key == first.key][: self.max_batch_size]
        taken = {id(r) for r in batch}
        self._queue = [r for r in self._queue if id(r) not in taken]
        return batch

    async def _work(self) -> None:
        while batch := self._take_batch():
            try:
                if self.around_batch is None:
                    steps = self.global_steps
                    results = await asyncio.to_thread(self._generate_batch, batch)
                else:
                    async with self.around_batch():
                        steps = self.global_steps  # the version of the weights this call uses
                        results = await asyncio.to_thread(self._generate_batch, batch)
            except Exception as error:  # every request of the call gets the error
                for request in batch:
                    if not request.future.done():
                        request.future.set_exception(error)
                continue
            self.requests += len(batch)
            for request, (token_ids, log_probs) in zip(batch, results, strict=True):
                if not request.future.done():
                    request.future.set_result((token_ids, log_probs, steps))

    @torch.no_grad()
    def _generate_batch(self, batch: list[_Request]) -> list[tuple[list[int], list[float]]]:
        from transformers import GenerationConfig

        params = batch[0].params  # the sampling of every row (equal keys)
        temperature = float(params.get("temperature", 1.0))
        greedy = temperature <= 0.0 or params.get("do_sample") is False
        config: dict[str, Any] = {
            "max_new_tokens": max(r.max_tokens for r in batch),
            "eos_token_id": self.eos_ids,
            "pad_token_id": self.pad_id,
            "num_beams": 1,
            "do_sample": not greedy,
            "repetition_penalty": float(params.get("repetition_penalty", 1.0)),
            "return_dict_in_generate": True,
            "output_logits": True,
        }
        if len(batch) > 1:  # the prompts in chunks of positions (in one pass: rows x heads x width^2 scores)
            config["prefill_chunk_size"] = self.prefill_chunk_size
        if not greedy:
            config.update(
                temperature=temperature,
                top_p=float(params.get("top_p", 1.0)),
                top_k=max(0, int(params.get("top_k", -1))),  # vLLM's -1 ("off") is HF's 0
            )
        # Left padding under a zero attention mask. A row is padded with its own first token, not pad_id: the
        # repetition penalty looks at every input id, and a pad id absent from the prompt would be penalised.
        width = max(len(r.prompt_ids) for r in batch)
        rows = [[r.prompt_ids[0]] * (width - len(r.prompt_ids)) + r.prompt_ids for r in batch]
        mask = [[0] * (width - len(r.prompt_ids)) + [1] * len(r.prompt_ids) for r in batch]
        input_ids = torch.tensor(rows, dtype=torch.long, device=self.device)
        attention_mask = torch.tensor(mask, dtype=torch.long, device=self.device)
        seed = params.get("seed")  # only a batch of one carries a seed
        with torch.random.fork_rng(enabled=seed is not None):
            if seed is not None:
                torch.manual_seed(int(seed))
            self.generate_calls += 1
            out = self.model.generate(
                input_ids=input_ids, attention_mask=attention_mask, generation_config=GenerationConfig(**config)
            )
        new = out.sequences[:, width:]  # [rows, steps]; a finished row continues with pad_id
        eos = set(self.eos_ids)
        results = []
        for i, request in enumerate(batch):
            tokens = [int(t) for t in new[i, : request.max_tokens].tolist()]
            end = next((j + 1 for j, t in enumerate(tokens) if t in eos), len(tokens))
            tokens = tokens[:end]
            # The logits before the sampling processors, [tokens, vocab]; temperature-scaled when sampling.
            logits = torch.stack([step[i] for step in out.logits[: len(tokens)]]).float()
            if not greedy:
                logits = logits / temperature
            picked = torch.tensor(tokens, dtype=torch.long, device=logits.device).unsqueeze(-1)
            log_probs = torch.log_softmax(logits, dim=-1).gather(-1, picked).squeeze(-1)
            results.append((tokens, [float(x) for x in log_probs.tolist()]))
        return results
