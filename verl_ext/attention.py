"""The actor's attention on GPU: flash-attn when it is installed, sdpa on padded rows otherwise (docs/cluster.md,
"flash-attn").

verl 0.9.1 asks transformers for ``flash_attention_2`` unless ``model.override_config.attn_implementation`` says
otherwise, and with ``model.use_remove_padding`` it packs a micro-batch's rows into one row, telling the sequences
apart by their position ids. flash-attn's varlen kernels honour that; transformers' sdpa does not (every sequence
of the row attends to the ones before it: ``tests/verl_ext/test_vx_attention.py``). flash-attn 2.8.3 is a source
build that not every machine can make, so the two settings follow whether it is installed, through two resolvers
the configs name (``configs/recurrent_trainer.yaml``); the driver resolves them once, before Ray starts.
"""

from __future__ import annotations

import importlib.util
import sys

from omegaconf import OmegaConf

_warned = False


def flash_attn_installed() -> bool:
    return importlib.util.find_spec("flash_attn") is not None


def remove_padding() -> bool:
    """``model.use_remove_padding``: pack rows only where flash-attn's varlen attention keeps them apart."""
    global _warned
    installed = flash_attn_installed()
    if not installed and not _warned:
        _warned = True
        print(
            "[memagent] flash-attn is not installed: the actor and reference use attn_implementation=sdpa on padded "
            "rows (use_remove_padding=false); same results, slower (docs/cluster.md, 'flash-attn')",
            file=sys.stderr,
        )
    return installed


def attn_implementation() -> str:
    return "flash_attention_2" if remove_padding() else "sdpa"


def register_resolvers() -> None:
    if not OmegaConf.has_resolver("recurrent_remove_padding"):
        OmegaConf.register_new_resolver("recurrent_remove_padding", remove_padding)
        OmegaConf.register_new_resolver("recurrent_attn_implementation", attn_implementation)
