"""Version guard shared by the CPU adaptations.

Every adaptation that touches a private verl name (``_ROLLOUT_REGISTRY``, ``EngineRegistry._engines``,
the module attribute ``initialize_global_process_group_ray``) calls :func:`require_verl` first: these
names carry no stability promise, so on any other verl release we fail loudly instead of patching blind.
"""

from __future__ import annotations

import importlib.metadata
import sys

SUPPORTED_VERL = "0.9.1"


def verl_version() -> str:
    """The installed verl's version; safe while ``import verl`` is still running (the attribute is set
    before ``VERL_USE_EXTERNAL_MODULES`` is processed, the metadata is the fallback)."""
    module = sys.modules.get("verl")
    version = getattr(module, "__version__", None)
    return version or importlib.metadata.version("verl")


def require_verl(what: str) -> None:
    """Refuse to touch a private verl name on a verl release these adaptations were not checked against."""
    version = verl_version()
    if version != SUPPORTED_VERL:
        raise RuntimeError(
            f"verl_ext.cpu: {what} touches a private name of verl {SUPPORTED_VERL}, but verl {version} is "
            "installed; re-check the adaptation against that release (see verl_ext/cpu/README.md)"
        )
