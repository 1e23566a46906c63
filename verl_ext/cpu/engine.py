"""Adaptation 4: verl's FSDP2 training engines registered for device ``cpu``.

``workers/engine/fsdp/transformer_impl.py:1143,1594`` register ``FSDPEngineWithLMHead`` and
``FSDPEngineWithValueHead`` for devices ``cuda``/``npu`` only, and ``EngineRegistry.get_engine_cls``
(``workers/engine/base.py:399-430``) looks engines up by the platform's device name: on ``cpu`` it raises
``No engine registered for device='cpu'``. The engines run on CPU (gloo process group,
``init_device_mesh("cpu")``, ``fully_shard``, bf16 autocast) with one exception, handled by thin
subclasses (:mod:`verl_ext.cpu._fsdp_cpu`) registered through the public ``EngineRegistry.register``:

- forward-only FSDP2 engines (the reference policy) are always built with
  ``CPUOffloadPolicy(pin_memory=True)`` (``transformer_impl.py:459-463``); pinning host memory needs an
  accelerator (``RuntimeError: Cannot access accelerator device when none is available``, from
  ``fully_shard`` -> ``_fsdp_param.py:315``), and offloading to the CPU means nothing when the device is the
  CPU. The CPU subclasses build the FSDP module as for a trainable engine (no offload policy).

``register()`` asserts a key is new, so the idempotency check reads the registry's dict (private, hence
version-guarded).

Config the engines need on CPU: ``+actor_rollout_ref.model.override_config.attn_implementation=sdpa``
(the default is flash_attention_2, ``workers/config/model.py:185``) and
``actor_rollout_ref.model.use_remove_padding=False`` (flash-attn varlen kernels).

Upstream change that makes this unnecessary: register the FSDP engines for ``cpu`` as well, with the
forward-only offload policy skipped (or ``pin_memory=False``) when the device is the CPU.
"""

from __future__ import annotations

from types import ModuleType

from verl_ext.cpu._compat import require_verl

ENGINE_MODULE = "verl.workers.engine.fsdp.transformer_impl"
# FSDP2 only: FSDP1 (strategy=fsdp, verl's default) refuses CPU modules with sync_module_states=True
# (transformer_impl.py:437-449: "The module has CPU parameters or buffers when `sync_module_states=True`,
# which requires them to be on GPU"). Unregistered, strategy=fsdp fails at once with verl's
# "No engine registered for device='cpu' ... backend='fsdp'": set actor_rollout_ref.actor.strategy=fsdp2.
BACKENDS = ("fsdp2",)
DEVICE = "cpu"
# model_type -> CPU engine class name in verl_ext.cpu._fsdp_cpu
ENGINES = {"language_model": "CPUFSDPEngineWithLMHead", "value_model": "CPUFSDPEngineWithValueHead"}


def register_engines(module: ModuleType | None = None) -> None:
    """Register the CPU FSDP engines for device cpu (idempotent). ``module`` is verl's transformer_impl,
    passed by the post-import hook; the engine subclasses import it."""
    require_verl("registering the FSDP engines for device cpu (reads EngineRegistry._engines)")
    from verl.workers.engine.base import EngineRegistry

    from verl_ext.cpu import _fsdp_cpu

    for model_type, class_name in ENGINES.items():
        engine_cls = getattr(_fsdp_cpu, class_name)
        registered = EngineRegistry._engines.get(model_type, {})
        missing = [b for b in BACKENDS if DEVICE not in registered.get(b, {})]
        if missing:
            EngineRegistry.register(model_type=model_type, backend=missing, device=DEVICE)(engine_cls)
