"""Adaptation 1: a ``cpu`` platform for verl's platform registry.

Answers ``plugin/platform/platform_manager.py:83-117`` (only nvidia/npu/rocm are registered; with no
accelerator verl falls back to ``nvidia``, so ``get_device_name()`` is ``cuda`` and the backend ``nccl``,
``platform_cuda.py:72,117``). Registered through the public ``PlatformRegistry.register`` and selected
only explicitly, with ``VERL_PLATFORM=cpu`` (``platform_manager.py:92``): ``is_platform_available`` is
False, so auto-detection on a GPU host never picks it.

Adaptation 2 (no code beyond this class): verl's resource pools always ask Ray for accelerator bundles
(``single_controller/ray/base.py:146-148,210,230``, ``use_gpu=True`` hard-coded, only ``GPU``/``NPU``
counted). The platform therefore names Ray's ``GPU`` resource and the launcher starts Ray with fake GPUs
(``+ray_kwargs.ray_init.num_gpus=N``); Ray sets ``CUDA_VISIBLE_DEVICES`` for those actors, which
CPU-only torch ignores.
"""

from __future__ import annotations

import contextlib
from types import ModuleType
from typing import Any

import torch
from verl.plugin.platform.platform_base import PlatformBase

PLATFORM_NAME = "cpu"


class PlatformCPU(PlatformBase):
    """Device ``cpu``, collective backend ``gloo``, Ray resource ``GPU`` (fake GPUs, one per rank)."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> ModuleType:
        from verl_ext.cpu import device_module

        return device_module

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        # Never auto-detected: a host gets this platform only with VERL_PLATFORM=cpu.
        return False

    def current_device(self) -> str:  # type: ignore[override]
        # verl passes get_device_id() to .to(...) and torch.device(...) (fsdp/transformer_impl.py:730,1052,
        # 1552, utils/fsdp_utils.py, protocol.py:1336): an int 0 there would mean cuda:0.
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None  # expandable segments etc. are CUDA caching-allocator settings

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        # Ray sets CUDA_VISIBLE_DEVICES for actors holding (fake) GPUs; verl copies the variable between
        # workers (single_controller/base/worker.py:178). Harmless on CPU-only torch.
        return "CUDA_VISIBLE_DEVICES"

    @contextlib.contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "GPU"  # fake Ray GPUs: the resource pools cannot be told to use none (adaptation 2)

    def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
        return {"num_gpus": num_gpus}

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None


def register_platform() -> type[PlatformCPU]:
    """Register ``cpu`` in verl's platform registry (public API; idempotent)."""
    from verl.plugin.platform import PlatformRegistry

    if PlatformRegistry.get(PLATFORM_NAME) is not PlatformCPU:
        PlatformRegistry.register(platform=PLATFORM_NAME)(PlatformCPU)
    return PlatformCPU
