"""Adaptation 3, a monkeypatch (adaptation 7 is the other): the default process-group backend on device cpu.

``utils/distributed.py:89`` builds ``backend = backend or f"cpu:gloo,{get_device_name()}:{get_nccl_backend()}"``;
on device ``cpu`` that is ``"cpu:gloo,cpu:gloo"`` and torch refuses it (``ValueError: Duplicate device type
cpu in backend string``), raised from ``TrainingWorker.__init__`` (``workers/engine_workers.py:89``). No
registry or config reaches that string, so we wrap the function: the default becomes ``"cpu:gloo"`` when
the platform's device is ``cpu``; everything else (explicit backends, e.g. ``checkpoint_engine/base.py:351``,
and every other platform) passes through unchanged.

``workers/engine_workers.py:38`` imports the function by name, so its binding is replaced too when that
module is already loaded (when it is not, it will import the wrapped function).

Upstream fix that makes this unnecessary: drop the duplicate entry in ``distributed.py:89`` when
``get_device_name() == "cpu"``.
"""

from __future__ import annotations

import functools
import sys

from verl_ext.cpu._compat import require_verl

TARGET_MODULE = "verl.utils.distributed"
TARGET_FUNCTION = "initialize_global_process_group_ray"
IMPORTERS = ("verl.workers.engine_workers",)  # modules holding their own binding of the function
CPU_BACKEND = "cpu:gloo"


def default_backend(backend: str | None) -> str | None:
    """The backend to pass on: ``cpu:gloo`` instead of verl's default when the device is ``cpu``."""
    if backend is not None:
        return backend
    from verl.utils.device import get_device_name

    return CPU_BACKEND if get_device_name() == "cpu" else None


def apply() -> None:
    """Wrap ``initialize_global_process_group_ray`` (idempotent)."""
    import verl.utils.distributed as distributed

    original = getattr(distributed, TARGET_FUNCTION)
    if getattr(original, "__verl_ext_cpu_patched__", False):
        return
    require_verl(f"the patch of {TARGET_MODULE}.{TARGET_FUNCTION}")

    @functools.wraps(original)
    def initialize_global_process_group_ray(timeout_second=None, backend=None):
        return original(timeout_second=timeout_second, backend=default_backend(backend))

    initialize_global_process_group_ray.__verl_ext_cpu_patched__ = True
    initialize_global_process_group_ray.__wrapped__ = original
    setattr(distributed, TARGET_FUNCTION, initialize_global_process_group_ray)
    for name in IMPORTERS:
        module = sys.modules.get(name)
        if module is not None and getattr(module, TARGET_FUNCTION, None) is original:
            setattr(module, TARGET_FUNCTION, initialize_global_process_group_ray)
