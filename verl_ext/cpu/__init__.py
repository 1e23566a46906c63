"""verl 0.9.1's V1 trainer on CPU, with the trainer code users run on GPU clusters.

Nine adaptations (see ``README.md`` here, "The adaptations", for the verl code each one answers):

1. :mod:`.platform`: a ``cpu`` platform in verl's ``PlatformRegistry``, chosen only with ``VERL_PLATFORM=cpu``;
2. fake Ray GPUs (config: ``+ray_kwargs.ray_init.num_gpus=N``; the platform names Ray's ``GPU`` resource);
3. :mod:`.dist_patch`: a monkeypatch, the default process-group backend ``cpu:gloo``;
4. :mod:`.engine`: verl's FSDP engines registered for device ``cpu``;
5. :mod:`.rollout`: a transformers rollout (server, replica, adapter) registered as ``hf_cpu``;
6. TransferQueue storage sized for a small Ray (config only);
7. :mod:`.logprobs`: for speed, the other monkeypatch: fp32 log-probabilities a block of tokens at a time, where
   verl loops over tokens when flash-attn is absent;
8. :mod:`.vllm_cpu`: a monkeypatch of vLLM, its CPU linear layers keep their weights so verl's weight sync reloads them
   (a vLLM rollout only: the hook fires when vLLM's module is imported);
9. vLLM's rollout values on CPU (config: ``configs/cpu_rollout/vllm.yaml``).

:func:`register` installs 1, 3, 4, 5, 7 and 8, idempotently. It must run in **every** process of a run (driver,
task runner, FSDP workers, rollout servers, agent-loop and reward workers), before verl first resolves its
platform; the launcher does that with ``VERL_USE_EXTERNAL_MODULES=verl_ext.cpu.load`` (imported by
``verl/__init__.py`` in every process) plus ``VERL_PLATFORM=cpu``, also passed to Ray's runtime env.
:mod:`verl_ext.cpu.load` calls :func:`register` only when ``VERL_PLATFORM=cpu``, so a GPU host that
happens to import it is unaffected. The registrations of verl's worker/rollout modules are ``wrapt``
post-import hooks, so processes that never use those modules (reward workers, agent-loop workers, the
TransferQueue actors) do not pay for importing them.

:mod:`.hf_server` (a plain in-process token server, used by tests of the agent loop) is independent of
all this.
"""

from __future__ import annotations

import os

from verl_ext.cpu.rollout import ROLLOUT_NAME

PLATFORM_ENV = "VERL_PLATFORM"
ROLLOUT_MODE = "async"
ADAPTER_FQN = "verl_ext.cpu.rollout.adapter.HFCPUServerAdapter"

_registered = False


def cpu_platform_requested() -> bool:
    """True when this process asks verl for the CPU platform (``VERL_PLATFORM=cpu``)."""
    return os.environ.get(PLATFORM_ENV, "").strip().lower() == "cpu"


def _register_replica(module) -> None:
    # Public API (workers/rollout/replica.py:312-327); registering again just rebinds the loader.
    from verl_ext.cpu.rollout.replica import load_replica_class

    module.RolloutReplicaRegistry.register(ROLLOUT_NAME, load_replica_class)


def _register_adapter(module) -> None:
    # workers/rollout/base.py:89-93: a module-level dict without a register() function (private name).
    from verl_ext.cpu._compat import require_verl

    require_verl("the _ROLLOUT_REGISTRY entry for hf_cpu")
    module._ROLLOUT_REGISTRY[(ROLLOUT_NAME, ROLLOUT_MODE)] = ADAPTER_FQN


def _register_engines(module) -> None:
    from verl_ext.cpu.engine import register_engines

    register_engines(module)


def register() -> None:
    """Install every CPU adaptation in this process (idempotent)."""
    global _registered
    if _registered:
        return
    import wrapt

    from verl_ext.cpu import dist_patch, logprobs, vllm_cpu
    from verl_ext.cpu.engine import ENGINE_MODULE
    from verl_ext.cpu.platform import register_platform

    register_platform()
    dist_patch.apply()
    wrapt.register_post_import_hook(_register_engines, ENGINE_MODULE)
    wrapt.register_post_import_hook(_register_replica, "verl.workers.rollout.replica")
    wrapt.register_post_import_hook(_register_adapter, "verl.workers.rollout.base")
    wrapt.register_post_import_hook(logprobs.apply, logprobs.TARGET_MODULE)
    wrapt.register_post_import_hook(vllm_cpu.apply, vllm_cpu.TARGET_MODULE)
    _registered = True
