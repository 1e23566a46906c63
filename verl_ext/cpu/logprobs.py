"""Adaptation 7, for speed: verl's token-by-token log-probabilities, computed a block of tokens at a time.

Without flash-attn's cross entropy (a CPU machine has none), ``utils/torch_functional.py:95-106``
(``logprobs_from_logits``) falls back to ``logprobs_from_logits_v2`` (``:166-199``), which for fp32 logits takes
``logsumexp`` one row at a time, to bound a GPU's peak memory. The FSDP engine calls it on a micro-batch's packed
logits, one row per token (``workers/engine/fsdp/transformer_impl.py:1522``), so on the CPU it is a Python loop
over every token, and a graph of as many nodes for the backward: 10% of an FSDP rank's samples in the CPU
replication's RL steps (py-spy; docs/replication_cpu.md, "What it costs"). Here fp32 and fp64 logits get the same
formula, ``logit[label] - logsumexp(logits)``, over blocks of :data:`ROWS_PER_BLOCK` rows (memory stays bounded
for a large vocabulary); every other dtype (bf16: verl's own comment says logsumexp is unstable there) goes to
verl's function unchanged, and so does every call in a process without ``VERL_PLATFORM=cpu`` (a test process that
registered the adaptations, a GPU host). Only the CPU platform installs it (:func:`verl_ext.cpu.register`).

Upstream change that would make this unnecessary: the fp32 branch of ``logprobs_from_logits_v2`` looping over
blocks of rows rather than single rows.
"""

from __future__ import annotations

import functools

import torch

from verl_ext.cpu._compat import require_verl

TARGET_MODULE = "verl.utils.torch_functional"
TARGET_FUNCTION = "logprobs_from_logits_v2"
# 1,024 rows of a 150K vocabulary are 600 MB of fp32 logits per block; the replication's reader has 1.1K.
ROWS_PER_BLOCK = 1024


def logprobs_in_blocks(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """``log_softmax(logits)[label]`` per row (fp32/fp64), ``ROWS_PER_BLOCK`` rows of the first dimension at once."""
    picked = torch.gather(logits, dim=-1, index=labels.unsqueeze(-1)).squeeze(-1)
    normalizers = torch.cat([torch.logsumexp(block, dim=-1) for block in logits.split(ROWS_PER_BLOCK)])
    return picked - normalizers


def takes_blocks(logits: torch.Tensor) -> bool:
    """Whether a call goes to :func:`logprobs_in_blocks`: fp32/fp64 logits, in a process of the CPU platform."""
    from verl_ext.cpu import cpu_platform_requested

    return logits.dtype in (torch.float32, torch.float64) and cpu_platform_requested()


def apply(module) -> None:
    """Wrap ``logprobs_from_logits_v2`` of ``module`` (verl.utils.torch_functional; idempotent).
    ``logprobs_from_logits`` looks the name up at each call, so rebinding the module's attribute is enough."""
    original = getattr(module, TARGET_FUNCTION)
    if getattr(original, "__verl_ext_cpu_patched__", False):
        return
    require_verl(f"the patch of {TARGET_MODULE}.{TARGET_FUNCTION}")

    @functools.wraps(original)
    def logprobs_from_logits_v2(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if takes_blocks(logits):
            return logprobs_in_blocks(logits, labels)
        return original(logits, labels)

    logprobs_from_logits_v2.__verl_ext_cpu_patched__ = True
    logprobs_from_logits_v2.__wrapped__ = original
    setattr(module, TARGET_FUNCTION, logprobs_from_logits_v2)
