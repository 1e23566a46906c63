"""A token-in/token-out generation server around a ``transformers`` causal LM, for CPU.

It has the coroutine API of verl's rollout servers (``vllm_async_server.py``) and of ``LLMServerClient``::

    await server.generate(request_id, prompt_ids=[...], sampling_params={...}) -> TokenOutput

so the memory agent loop can be driven by it directly (tests, in-process) or, wrapped as a Ray actor
(``ray.remote(HFTokenServer)``), behind verl's load balancer and ``LLMServerClient`` (the CPU trainer).
Requests are served one at a time (an asyncio lock; generation runs in a thread so the event loop stays
free). Semantics follow the vLLM adapter: ``max_tokens`` caps new tokens, the returned ids include the
eos token when one was generated, ``temperature == 0`` is greedy, ``top_k == -1`` is "off", and
``logprobs`` asks for the log-probability of each generated token (under the temperature-scaled
distribution, like vLLM's ``processed_logprobs``).
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import torch
from verl.workers.rollout.replica import TokenOutput

DEFAULT_MAX_TOKENS = 512


class HFTokenServer:
    """Generate with a Hugging Face causal LM in this process (or in a Ray actor)."""

    def __init__(
        self,
        model: str | os.PathLike[str] | Any,
        tokenizer: Any = None,
        dtype: torch.dtype = torch.float32,
        device: str = "cpu",
        max_model_len: int | None = None,
    ) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if isinstance(model, str | os.PathLike):
            tokenizer = tokenizer or AutoTokenizer.from_pretrained(model)
            model = AutoModelForCausalLM.from_pretrained(model, dtype=dtype)
        if tokenizer is None:
            raise ValueError("HFTokenServer needs a tokenizer when given a model object")
        self.model = model.to(device).eval()
        self.tokenizer = tokenizer
        self.device = torch.device(device)
        self.max_model_len = max_model_len
        self.global_steps = 0  # the weight version, as verl's servers report it (extra_fields)
        generation_eos = getattr(model.generation_config, "eos_token_id", None)
        eos = generation_eos if isinstance(generation_eos, list) else [generation_eos]
        self.eos_ids = sorted({int(e) for e in [*eos, tokenizer.eos_token_id] if e is not None})
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_ids[0]
        self._lock: asyncio.Lock | None = None
        self._lock_loop: asyncio.AbstractEventLoop | None = None
        self.requests = 0

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
        if self.max_model_len is not None and len(prompt_ids) + max_tokens > self.max_model_len:
            raise ValueError(
                f"prompt ({len(prompt_ids)} tokens) + max_tokens ({max_tokens}) exceeds max_model_len "
                f"({self.max_model_len})"
            )
        loop = asyncio.get_running_loop()
        if self._lock_loop is not loop:  # an asyncio lock belongs to one event loop (a Ray actor has one)
            self._lock, self._lock_loop = asyncio.Lock(), loop
        async with self._lock:
            self.requests += 1
            token_ids, log_probs = await asyncio.to_thread(self._generate, list(prompt_ids), max_tokens, params)
        return TokenOutput(
            token_ids=token_ids,
            log_probs=log_probs if params.get("logprobs") else None,
            stop_reason="completed",
            num_preempted=0,
            extra_fields={"global_steps": self.global_steps},
        )

    @torch.no_grad()
    def _generate(
        self, prompt_ids: list[int], max_tokens: int, params: dict[str, Any]
    ) -> tuple[list[int], list[float]]:
        from transformers import GenerationConfig

        temperature = float(params.get("temperature", 1.0))
        greedy = temperature <= 0.0 or params.get("do_sample") is False
        config: dict[str, Any] = {
            "max_new_tokens": max_tokens,
            "eos_token_id": self.eos_ids,
            "pad_token_id": self.pad_id,
            "num_beams": 1,
            "do_sample": not greedy,
            "repetition_penalty": float(params.get("repetition_penalty", 1.0)),
            "return_dict_in_generate": True,
            "output_logits": True,
        }
        if not greedy:
            config.update(
                temperature=temperature,
                top_p=float(params.get("top_p", 1.0)),
                top_k=max(0, int(params.get("top_k", -1))),  # vLLM's -1 ("off") is HF's 0
            )
        input_ids = torch.tensor([prompt_ids], dtype=torch.long, device=self.device)
        seed = params.get("seed")
        with torch.random.fork_rng(enabled=seed is not None):
            if seed is not None:
                torch.manual_seed(int(seed))
            out = self.model.generate(
                input_ids=input_ids,
                attention_mask=torch.ones_like(input_ids),
                generation_config=GenerationConfig(**config),
            )
        new = out.sequences[0, input_ids.shape[1] :]
        logits = torch.stack(out.logits, dim=1)[0].float()  # [new tokens, vocab], before sampling processors
        if not greedy:
            logits = logits / temperature
        log_probs = torch.log_softmax(logits, dim=-1).gather(-1, new.unsqueeze(-1)).squeeze(-1)
        return [int(t) for t in new.tolist()], [float(x) for x in log_probs.tolist()]
