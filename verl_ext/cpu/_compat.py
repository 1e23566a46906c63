"""Version guard and post-import hooks shared by the CPU adaptations.

Every adaptation that touches a private verl name (``_ROLLOUT_REGISTRY``, ``EngineRegistry._engines``,
the module attribute ``initialize_global_process_group_ray``) calls :func:`require_verl` first: these
names carry no stability promise, so on any other verl release we fail loudly instead of patching blind.

:func:`after_import` runs a callback once a module has been imported (at once if it already has been).
It lets :func:`verl_ext.cpu.register` run inside ``import verl`` (``VERL_USE_EXTERNAL_MODULES``) without
importing verl's heavy worker/rollout modules into processes that never use them (reward workers,
agent-loop workers, the TransferQueue actors).
"""

from __future__ import annotations

import importlib.abc
import importlib.metadata
import sys
import threading
from collections.abc import Callable
from types import ModuleType

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


_lock = threading.RLock()
_pending: dict[str, list[Callable[[ModuleType], None]]] = {}


class _RunCallbacks(importlib.abc.Loader):
    """Wraps a module's real loader: execute the module, then run the callbacks waiting for it."""

    def __init__(self, inner: importlib.abc.Loader, fullname: str) -> None:
        self.inner = inner
        self.fullname = fullname

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        with _lock:
            callbacks = _pending.pop(self.fullname, [])
        for callback in callbacks:
            callback(module)

    def __getattr__(self, name: str):  # get_source, get_filename, is_package, ... of the real loader
        return getattr(self.inner, name)


class _AfterImportFinder(importlib.abc.MetaPathFinder):
    """Finds the watched modules with the other finders and wraps their loaders."""

    def find_spec(self, fullname, path, target=None):
        with _lock:
            if fullname not in _pending:
                return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and not isinstance(spec.loader, _RunCallbacks):
                    spec.loader = _RunCallbacks(spec.loader, fullname)
                return spec
        return None


_finder = _AfterImportFinder()


def after_import(module_name: str, callback: Callable[[ModuleType], None]) -> None:
    """Call ``callback(module)`` once ``module_name`` is imported; at once if it already is."""
    module = sys.modules.get(module_name)
    spec = getattr(module, "__spec__", None)
    initializing = getattr(spec, "_initializing", False)
    if module is not None and not initializing:
        callback(module)
        return
    with _lock:
        _pending.setdefault(module_name, []).append(callback)
        if _finder not in sys.meta_path:
            sys.meta_path.insert(0, _finder)
