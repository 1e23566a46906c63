"""verl_ext and the base trainer config are generic over agents: nothing in them is named for the memory
agent or
reads its settings. The memory agent's name and settings live in recurrent/impls/memory.py and
configs/memory_agent.yaml only."""

from __future__ import annotations

import ast
from pathlib import Path

from omegaconf import OmegaConf

REPO = Path(__file__).resolve().parents[2]
# The memory agent's classes and fields (recurrent/impls/memory.py) and the names the generic layers used to have.
MEMORY_NAMES = {
    "MemoryWorkflow",
    "MemorySession",
    "MemoryConfig",
    "MemoryRollout",
    "memory_ids_template",
    "final_ids_template",
    "max_turn_lengths",
    "chunk_size",
    "context_key",
    "question_key",
    "max_memorization_length",
    "max_final_response_length",
    "max_chunks",
    "final_prompt",
    "question_overflow",
    "memory_trace",
    "memory_agent",
    "memory_row_keys",
    "memory_credit_fields",
    "session_stats",
}


RUN_CONFIGS = {path.stem for path in (REPO / "configs").glob("*.yaml")}  # a run's name, e.g. a default


def names_in(path: Path) -> set[str]:
    """Every name a module defines or reads: classes, functions, arguments, variables, attributes, string
    constants that look like identifiers or config keys (docstrings and run config names aside), and imported
    modules."""
    found: set[str] = set()
    tree = ast.parse(path.read_text())
    docstrings = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
    for node in ast.walk(tree):
        if id(node) in docstrings or (isinstance(node, ast.Constant) and node.value in RUN_CONFIGS):
            continue
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            found.add(node.name)
        elif isinstance(node, ast.arg):
            found.add(node.arg)
        elif isinstance(node, ast.Name):
            found.add(node.id)
        elif isinstance(node, ast.Attribute):
            found.add(node.attr)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.update(part for part in node.value.replace("/", ".").split(".") if part.isidentifier())
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            found.add(node.module or "")
            found.update(alias.name for alias in node.names)
    return found


def test_no_module_of_verl_ext_is_named_for_the_memory_agent_or_reads_its_settings():
    offenders = {}
    paths = sorted((REPO / "verl_ext").rglob("*.py"))
    assert len(paths) > 20  # the glue itself, not an empty folder
    for path in paths:
        names = names_in(path)
        mine = ("memagent", "experiments", "taskutils", "recurrent.impls")
        hits = sorted(names & MEMORY_NAMES | {n for n in names if n.startswith(mine)})
        hits += sorted(n for n in names if "memagent" in n.lower() or n.lower().startswith("memory_agent"))
        if "memory" in path.stem:
            hits.append(f"module name {path.stem}")
        if hits:
            offenders[str(path.relative_to(REPO))] = hits
    assert offenders == {}


def test_the_scan_sees_a_memory_name():
    """The scan above would see each way a module can name the memory agent or read its settings."""
    source = (
        "from recurrent.impls.memory import MemoryConfig\n"
        "def f(config):\n    return config.recurrent.config.chunk_size\n"
        "x = config.get('context_key')\n"
    )
    path = REPO / "tests" / "verl_ext" / "data" / "_scan_probe.py"
    path.write_text(source)
    try:
        names = names_in(path)
    finally:
        path.unlink()
    assert {"MemoryConfig", "chunk_size", "context_key", "recurrent.impls.memory"} <= names


def config_keys(node, prefix: str = "") -> set[str]:
    keys: set[str] = set()
    if isinstance(node, dict):
        for key, value in node.items():
            keys.add(str(key))
            keys |= config_keys(value, f"{prefix}{key}.")
    return keys


def test_the_base_trainer_config_names_no_agent():
    base = OmegaConf.to_container(OmegaConf.load(REPO / "configs" / "recurrent_trainer.yaml"), resolve=False)
    assert base["recurrent"]["agent"] is None and base["recurrent"]["config"] == {}
    assert config_keys(base) & MEMORY_NAMES == set()
    text = (REPO / "configs" / "recurrent_trainer.yaml").read_text()
    values = "\n".join(line.split("#")[0] for line in text.splitlines())
    assert "recurrent.config." not in values
    # No MemAgent module either: the reward is the agent's config's (configs/memory_agent.yaml).
    assert "taskutils" not in values and "recurrent.impls" not in values and "experiments" not in values
    assert base["reward"]["custom_reward_function"]["path"] is None
    # The memory agent's settings are its own config file's, composed on the base.
    memory = OmegaConf.load(REPO / "configs" / "memory_agent.yaml")
    assert memory.defaults[0] == "recurrent_trainer" and memory.recurrent.agent == "memory"
    assert {"chunk_size", "context_key", "max_memorization_length"} <= set(memory.recurrent.config)
    assert memory.reward.custom_reward_function.path == "pkg://taskutils.verifiers.strict"
