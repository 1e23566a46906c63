"""verl plugin: registers our agent loop in every process that uses verl's agent loops.

Declared in ``pyproject.toml`` as the entry point ``recurrent`` of the group ``verl.plugins``;
``import verl`` loads every such entry point in every process (driver, task runner, Ray workers;
``verl/__init__.py:55-76``) and swallows import errors at DEBUG level, so a test asserts the result.

verl's agent-loop module takes seconds to import (tensordict, transformers, ...) and most processes that
import verl never run an agent loop, so the plugin does not import it: a ``wrapt`` post-import hook adds
``recurrent_agent`` to the registry as soon as that module has been imported (at once if it already has).
The entry is what ``@register`` writes; ``hydra.utils.instantiate`` imports :mod:`verl_ext.agent_loop`
when it is used.

The reward needs no registration: verl loads ``reward.custom_reward_function.path=pkg://taskutils.verifiers.strict``
by module path in each reward worker.
"""

from __future__ import annotations

from types import ModuleType

import wrapt

AGENT_LOOP_MODULE = "verl.experimental.agent_loop.agent_loop"
AGENT_LOOPS = {"recurrent_agent": "verl_ext.agent_loop.RecurrentAgentLoop"}


def register_agent_loops(module: ModuleType) -> None:
    """Write our entries into verl's agent-loop registry (``agent_loop.py:467-478``)."""
    for name, target in AGENT_LOOPS.items():
        module._agent_loop_registry[name] = {"_target_": target}


def install() -> None:
    """Register our loops once verl's agent-loop module is imported (at once if it already is)."""
    wrapt.register_post_import_hook(register_agent_loops, AGENT_LOOP_MODULE)


install()
