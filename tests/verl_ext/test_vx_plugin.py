"""The `verl.plugins` entry point registers the memory agent loop in a fresh process (verl logs plugin import
failures at DEBUG level only, so a broken plugin would otherwise go unnoticed), without slowing `import verl`."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import entry_points

from verl.experimental.agent_loop import agent_loop

from verl_ext import plugin

FRESH_PROCESS = """
import sys
import verl  # loads every verl.plugins entry point, as in each Ray worker process
assert "verl.experimental.agent_loop.agent_loop" not in sys.modules, "the plugin must not import the agent loops"
from verl.experimental.agent_loop.agent_loop import AgentLoopBase, _agent_loop_registry
entry = _agent_loop_registry["recurrent_agent"]
assert entry == {"_target_": "verl_ext.agent_loop.RecurrentAgentLoop"}, _agent_loop_registry
assert "single_turn_agent" in _agent_loop_registry  # verl's own loops are still there
import hydra
assert issubclass(hydra.utils.get_class(_agent_loop_registry["recurrent_agent"]["_target_"]), AgentLoopBase)
from verl.utils.import_utils import load_extern_object
reward = load_extern_object(module_path="pkg://taskutils.verifiers.strict", object_name="compute_score")
assert reward.__module__ == "taskutils.verifiers.strict"
print("registered")
"""


def test_entry_point_is_declared():
    (ep,) = [ep for ep in entry_points(group="verl.plugins") if ep.name == "recurrent"]
    assert ep.value == "verl_ext.plugin"


def test_a_fresh_process_registers_the_memory_agent():
    env = {k: v for k, v in os.environ.items() if k not in ("VERL_USE_EXTERNAL_PLUGINS", "VERL_USE_EXTERNAL_MODULES")}
    result = subprocess.run([sys.executable, "-c", FRESH_PROCESS], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("registered")


def test_install_registers_at_once_when_verl_agent_loops_are_already_imported():
    registry = agent_loop._agent_loop_registry
    saved = registry.pop("recurrent_agent")
    try:
        plugin.install()
        assert registry["recurrent_agent"] == {"_target_": "verl_ext.agent_loop.RecurrentAgentLoop"}
    finally:
        registry["recurrent_agent"] = saved
