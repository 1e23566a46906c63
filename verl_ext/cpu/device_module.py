"""What ``verl.utils.device.get_torch_device()`` returns on the CPU platform: ``torch.cpu`` plus the
accelerator calls verl makes on that object, as no-ops or CPU equivalents.

verl calls, through ``get_torch_device()``: ``empty_cache`` (27 call sites), ``synchronize`` (10),
``is_available``, ``set_device``, ``mem_get_info``, ``set_per_process_memory_fraction``, ``ipc_collect``,
``get_rng_state``/``set_rng_state``, ``memory_allocated``/``max_memory_*`` (e.g.
``workers/engine_workers.py:219-220``), streams and events. ``torch.cpu`` has only part of these.

``is_available()`` is False on purpose: verl asks it only to guard accelerator-only work (memory stats
in ``utils/memory_utils.py:80-135``, ``map_location`` in ``protocol.py:416``), all of which is skipped or
falls back to ``"cpu"`` when it is False.
"""

from __future__ import annotations

import torch
import torch.cpu
from torch.cpu import Event, Stream, StreamContext, current_stream, stream  # noqa: F401  (re-exported)

amp = torch.cpu.amp


def is_available() -> bool:
    return False


def current_device() -> str:
    # A string, never an int: verl passes it to .to(...)/torch.device(...), where 0 would mean cuda:0.
    return "cpu"


def device_count() -> int:
    return 1


def set_device(device=None) -> None:
    return None


def synchronize(device=None) -> None:
    return None


def empty_cache() -> None:
    return None


def ipc_collect() -> None:
    return None


def reset_peak_memory_stats(device=None) -> None:
    return None


def reset_accumulated_memory_stats(device=None) -> None:
    return None


def set_per_process_memory_fraction(fraction: float, device=None) -> None:
    return None


def memory_allocated(device=None) -> int:
    return 0


def memory_reserved(device=None) -> int:
    return 0


def max_memory_allocated(device=None) -> int:
    return 0


def max_memory_reserved(device=None) -> int:
    return 0


def mem_get_info(device=None) -> tuple[int, int]:
    """(free, total) bytes of host memory, the CPU analogue of ``torch.cuda.mem_get_info``."""
    import psutil

    memory = psutil.virtual_memory()
    return int(memory.available), int(memory.total)


def get_rng_state(device=None) -> torch.Tensor:
    return torch.get_rng_state()


def set_rng_state(state: torch.Tensor, device=None) -> None:
    torch.set_rng_state(state)


def manual_seed(seed: int) -> None:
    torch.manual_seed(seed)


def manual_seed_all(seed: int) -> None:
    torch.manual_seed(seed)


def get_device_name(device=None) -> str:
    return "cpu"


def __getattr__(name: str):
    """Anything else verl may reach for: torch.cpu's attribute, if it has one."""
    try:
        return getattr(torch.cpu, name)
    except AttributeError:
        raise AttributeError(f"the CPU device module has no attribute {name!r}") from None
