"""verl's FSDP engines with the one change CPU needs (imports verl's FSDP engine module; load lazily).

See :mod:`verl_ext.cpu.engine`: forward-only engines are built without FSDP2's ``CPUOffloadPolicy``
(``workers/engine/fsdp/transformer_impl.py:459-463`` would pin host memory, which needs an accelerator).
"""

from __future__ import annotations

import dataclasses

from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead, FSDPEngineWithValueHead


class _NoHostOffloadMixin:
    """Build the FSDP module of a forward-only engine like a trainable one's: without the offload policy.

    ``_build_fsdp_module`` reads ``engine_config.forward_only`` only to choose the offload policy (FSDP2,
    ``transformer_impl.py:459``) or ``CPUOffload`` (FSDP1, ``:432``); it sees a copy of the config with
    ``forward_only=False``, and the engine keeps its own config (no optimizer is built, ``:616``)."""

    def _build_fsdp_module(self, module):
        config = self.engine_config
        if not config.forward_only:
            return super()._build_fsdp_module(module)
        self.engine_config = dataclasses.replace(config, forward_only=False)
        try:
            return super()._build_fsdp_module(module)
        finally:
            self.engine_config = config


class CPUFSDPEngineWithLMHead(_NoHostOffloadMixin, FSDPEngineWithLMHead):
    """``FSDPEngineWithLMHead`` for device cpu."""


class CPUFSDPEngineWithValueHead(_NoHostOffloadMixin, FSDPEngineWithValueHead):
    """``FSDPEngineWithValueHead`` for device cpu."""
