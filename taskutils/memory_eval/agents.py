"""The agent of a method, as the harness runs it: its settings from the model table, the episode factory of each
eval item (the registry's agent by name or file), and what an agent sees of an item."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict
from typing import Any

from recurrent.interface import Episode, is_agent_file, load_register
from taskutils.memory_eval import config as cfg
from taskutils.memory_eval import scoring


def agent_options(entry: cfg.ModelEntry, method: str, agent_values: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The inference settings of a method's agent: the model table's section named after the agent (``memory``,
    ``direct``: its budgets), the method's final prompt, and the fields of ``--agent-config`` (``agent_values``),
    which win; an agent without any of these runs on its defaults."""
    agent, final_prompt = cfg.method_agent(method)
    section = None if is_agent_file(agent) else getattr(entry, agent, None)
    options = asdict(section) if section is not None else {}
    if final_prompt is not None:
        options["final_prompt"] = final_prompt
    return {**options, **(agent_values or {})}


def reads_context(method: str, agent_values: Mapping[str, Any] | None = None) -> bool:
    """Whether a method's agent reads an item's document: ``context`` among the columns its registration declares
    (an eval item may then leave ``context`` out only for agents that read none)."""
    agent, _ = cfg.method_agent(method)
    register = load_register(agent)
    config = register.make_config(
        {k: v for k, v in (agent_values or {}).items() if k in register.config_cls.__dataclass_fields__}
    )
    return "context" in (*register.columns_of(config), *register.large_columns_of(config))


def make_workflow(
    entry: cfg.ModelEntry, method: str, tokenizer: Any, agent_values: Mapping[str, Any] | None = None
) -> Callable[[dict[str, Any]], Episode]:
    """The episode factory of one method: its agent from the registry, by name or file."""
    agent, _ = cfg.method_agent(method)
    workflow = load_register(agent).for_inference(tokenizer, **agent_options(entry, method, agent_values))

    def make_episode(item: dict[str, Any]) -> Episode:
        return workflow.episode(agent_sample(item))

    return make_episode


def agent_sample(item: dict[str, Any]) -> dict[str, Any]:
    """What an agent sees of an eval item: its fields without the gold answers, the question stripped (``input``;
    also as ``prompt``, the column training reads it from) and the document (``context``, empty when the item has
    none: an agent that reads no document needs none)."""
    question = str(item.get("input", "")).strip()
    sample = {key: value for key, value in item.items() if key not in scoring.GOLD_FIELDS}
    return {**sample, "input": question, "prompt": question, "context": item.get("context") or ""}
