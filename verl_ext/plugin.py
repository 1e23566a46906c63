"""verl plugin: registers the memory agent loop in every process that uses verl's agent loops.

Declared in ``pyproject.toml`` as the entry point ``verl_ext`` of the group ``verl.plugins``;
``import verl`` loads every such entry point in every process (driver, task runner, Ray workers;
``verl/__init__.py:55-76``) and swallows import errors at DEBUG level, so a test asserts the result.

verl's agent-loop module takes seconds to import (tensordict, transformers, ...) and most processes that
import verl never run an agent loop, so the plugin does not import it: it adds ``memory_agent`` to the
registry as soon as that module has been imported (at once if it already has). The entry is what
``@register`` writes; ``hydra.utils.instantiate`` imports :mod:`verl_ext.agent_loop` when it is used.

The reward needs no registration: verl loads ``reward.custom_reward_function.path=pkg://verl_ext.reward``
by module path in each reward worker.
"""

from __future__ import annotations

import importlib.abc
import sys
from types import ModuleType

AGENT_LOOP_MODULE = "verl.experimental.agent_loop.agent_loop"
AGENT_LOOPS = {"memory_agent": "verl_ext.agent_loop.MemoryAgentLoop"}


def register_agent_loops(module: ModuleType) -> None:
    """Write our entries into verl's agent-loop registry (``agent_loop.py:467-478``)."""
    for name, target in AGENT_LOOPS.items():
        module._agent_loop_registry[name] = {"_target_": target}


class _ThenRegister(importlib.abc.Loader):
    """Wraps the real loader of verl's agent-loop module: run it, then register our loops."""

    def __init__(self, inner: importlib.abc.Loader, finder: _AgentLoopImportHook) -> None:
        self.inner = inner
        self.finder = finder

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        register_agent_loops(module)
        if self.finder in sys.meta_path:
            sys.meta_path.remove(self.finder)

    def __getattr__(self, name: str):  # get_source, get_filename, ... of the real loader
        return getattr(self.inner, name)


class _AgentLoopImportHook(importlib.abc.MetaPathFinder):
    """Finds verl's agent-loop module with the other finders and wraps its loader."""

    def find_spec(self, fullname, path, target=None):
        if fullname != AGENT_LOOP_MODULE:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _ThenRegister(spec.loader, self)
                return spec
        return None


def install() -> None:
    module = sys.modules.get(AGENT_LOOP_MODULE)
    if module is not None and hasattr(module, "_agent_loop_registry"):
        register_agent_loops(module)
    elif not any(isinstance(f, _AgentLoopImportHook) for f in sys.meta_path):
        sys.meta_path.insert(0, _AgentLoopImportHook())


install()
