"""An in-process Hugging Face generation backend for CPU, with verl's rollout-worker shape.

``HFBackend.generate_sequences(prompts)`` takes the batch a verl rollout worker takes (left-padded
``input_ids``, ``attention_mask``, ``position_ids``; sampling settings in ``meta_info``) and returns what it
returns: ``prompts`` (the input ids), ``responses`` (right-padded to ``pad_to``), ``response_mask``, and
``input_ids`` / ``attention_mask`` / ``position_ids`` extended over the response, as verl's rollouts do.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from verl import DataProto

from recurrent.padding import pad_tensor_list_to_length, rollout_tensors


def _eos_list(eos: int | list[int] | tuple[int, ...] | None) -> list[int]:
    if eos is None:
        return []
    return [int(eos)] if isinstance(eos, int) else [int(e) for e in eos]


def response_mask_from_eos(responses: torch.Tensor, eos_ids: list[int], lengths: torch.Tensor) -> torch.Tensor:
    """1 up to and including the first eos of each row, and never past the row's generated ``lengths``."""
    is_eos = torch.isin(responses, torch.tensor(eos_ids, dtype=responses.dtype)).long()
    before_or_at_first_eos = (torch.cumsum(is_eos, dim=1) - is_eos) == 0
    generated = torch.arange(responses.shape[1]).unsqueeze(0) < lengths.unsqueeze(1)
    return (before_or_at_first_eos & generated).long()


class HFBackend:
    """Generate with a ``transformers`` causal LM in this process (CPU by default).

    ``batched=True`` runs one left-padded ``generate`` per call; ``batched=False`` generates each row alone,
    without padding, which is bit-for-bit an unpadded single-row generate (use it for determinism tests).
    """

    def __init__(
        self,
        model: str | os.PathLike[str] | Any,
        tokenizer: Any = None,
        batched: bool = True,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
    ) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if isinstance(model, tuple):
            model, tokenizer = model
        if isinstance(model, str | os.PathLike):
            if tokenizer is None:
                tokenizer = AutoTokenizer.from_pretrained(model)
            model = AutoModelForCausalLM.from_pretrained(model, dtype=dtype)
        if tokenizer is None:
            raise ValueError("HFBackend needs a tokenizer when given a model object")
        self.model = model.to(device).eval()
        self.tokenizer = tokenizer
        self.batched = batched
        self.device = torch.device(device)

    def _generation_config(self, meta: dict[str, Any], eos_ids: list[int], pad_id: int) -> Any:
        from transformers import GenerationConfig

        kwargs: dict[str, Any] = {
            "max_new_tokens": int(meta["max_tokens"]),
            "eos_token_id": eos_ids,
            "pad_token_id": pad_id,
            "num_beams": 1,
            # Sample from the policy as meta_info says: a checkpoint's generation_config extras (Qwen2.5 ships
            # repetition_penalty 1.05, top_k 20) would otherwise fill the unset fields, unlike verl's rollouts.
            "repetition_penalty": 1.0,
        }
        if meta.get("do_sample", False):
            kwargs.update(
                do_sample=True,
                temperature=float(meta.get("temperature", 1.0)),
                top_p=float(meta.get("top_p", 1.0)),
                top_k=max(0, int(meta.get("top_k", -1))),  # verl's -1 (vLLM's "off") is HF's 0
            )
        else:
            kwargs["do_sample"] = False
        return GenerationConfig(**kwargs)

    @torch.no_grad()
    def _generate(self, ids: torch.Tensor, mask: torch.Tensor, config: Any) -> list[torch.Tensor]:
        """New tokens of each row (HF fills finished rows with pad; trimmed later by the response mask).

        HF derives positions from the attention mask, which gives the input ``position_ids`` on real tokens."""
        if self.batched:
            keep = mask.any(dim=0).nonzero()
            start = int(keep[0]) if len(keep) else ids.shape[1]  # drop all-pad columns: masked anyway
            ids, mask = ids[:, start:].to(self.device), mask[:, start:].to(self.device)
            out = self.model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
            return list(out[:, ids.shape[1] :].cpu())
        rows = []
        for row, row_mask in zip(ids, mask, strict=True):
            real = row[row_mask.bool()].unsqueeze(0).to(self.device)
            out = self.model.generate(input_ids=real, attention_mask=torch.ones_like(real), generation_config=config)
            rows.append(out[0, real.shape[1] :].cpu())
        return rows

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Generate one response per row; see the module docstring for the keys in and out."""
        meta = prompts.meta_info
        max_tokens = int(meta["max_tokens"])
        pad_to = int(meta.get("pad_to", max_tokens))
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        if pad_to < max_tokens:
            raise ValueError(f"pad_to ({pad_to}) must be >= max_tokens ({max_tokens}): responses would not fit")
        eos_ids = _eos_list(meta.get("eos_token_id", self.tokenizer.eos_token_id))
        if not eos_ids:
            raise ValueError("no eos_token_id in meta_info and the tokenizer has none")
        pad_id = meta.get("pad_token_id", self.tokenizer.pad_token_id)
        pad_id = eos_ids[0] if pad_id is None else int(pad_id)

        input_ids = prompts.batch["input_ids"]
        attention_mask = prompts.batch["attention_mask"]
        position_ids = prompts.batch["position_ids"]
        config = self._generation_config(meta, eos_ids, pad_id)
        seed = meta.get("seed")
        with torch.random.fork_rng(enabled=seed is not None):
            if seed is not None:
                torch.manual_seed(int(seed))
            new_tokens = self._generate(input_ids, attention_mask, config)

        lengths = torch.tensor([len(t) for t in new_tokens], dtype=torch.long)
        responses = pad_tensor_list_to_length(new_tokens, pad_id, max_length=pad_to, left_pad=False)
        response_mask = response_mask_from_eos(responses, eos_ids, lengths)
        responses = responses.masked_fill(response_mask == 0, pad_id)  # pad after eos, whatever HF put there

        tensors = rollout_tensors(input_ids, attention_mask, position_ids, responses, response_mask)
        return DataProto.from_dict(
            tensors=tensors, non_tensors=dict(prompts.non_tensor_batch), meta_info=dict(prompts.meta_info)
        )
