"""A run config composed as the trainer composes it, from anywhere: a name of the repository's ``configs/``, or a
YAML file of your own folder whose ``defaults`` name the repository's configs (``recurrent_trainer``,
``cpu_platform``, ...), as ``scripts/train_tiny_cpu.sh CONFIG=my_agent_cpu.yaml`` and ``python -m verl_ext.main
--config-dir DIR --config-name NAME`` read it (docs/write_your_own_agent.md, "4. Check it against the trainer").

Hydra reads ``hydra.searchpath`` from the primary config only; a file outside ``configs/`` therefore gets the
repository's configs put on its search path here, after the ones it declares itself (verl's, for ``ppo_trainer``).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path

from omegaconf import DictConfig

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"  # the repository's run configs
VERL_CONFIGS = "pkg://verl.trainer.config"  # where verl's ppo_trainer is found


def local_search_path(entry: str) -> str:
    """A search-path entry that Hydra reads without importing anything: verl's ``pkg://verl.trainer.config`` becomes
    ``file://`` of the same folder, other entries stay. Hydra opens a ``pkg://`` entry by importing the package, and
    verl's ``__init__`` imports torch, tensordict, Ray and transformers (~6 s), which composing a config (``--cfg
    job``, DRY_RUN, the plan) never needs; a run imports verl later, when it starts it."""
    if entry != VERL_CONFIGS:
        return entry
    spec = importlib.util.find_spec("verl")  # a top-level package is found without running its __init__
    if spec is None or not spec.submodule_search_locations:
        return entry  # no verl installed: Hydra's own error says so
    folder = Path(next(iter(spec.submodule_search_locations))) / "trainer" / "config"
    return f"file://{folder}" if folder.is_dir() else entry


def declared_search_path(path: Path) -> list[str]:
    """The ``hydra.searchpath`` a run config file declares (Hydra reads it from the primary config only)."""
    import yaml

    return list(((yaml.safe_load(path.read_text()) or {}).get("hydra") or {}).get("searchpath") or [])


def search_path_override(entries: Sequence[str]) -> str:
    """The Hydra override that sets ``hydra.searchpath`` to ``entries``, each read as :func:`local_search_path` says
    and quoted (a folder's name may hold a space or a comma)."""
    quoted = ("'" + local_search_path(e).replace("\\", "\\\\").replace("'", "\\'") + "'" for e in entries)
    return f"hydra.searchpath=[{','.join(quoted)}]"


def sets_search_path(overrides: Sequence[str]) -> bool:
    """Whether the caller's overrides set ``hydra.searchpath`` themselves (then theirs stands)."""
    return any(o.lstrip("+~").startswith("hydra.searchpath=") for o in overrides)


def is_config_file(config: str | Path) -> bool:
    """Whether ``config`` names a YAML file (a path) rather than a config of ``configs/`` (a name)."""
    text = str(config)
    return "/" in text or text.endswith((".yaml", ".yml"))


def compose_run_config(config: str | Path, overrides: Sequence[str] = ()) -> DictConfig:
    """The composed config of ``config`` (a name of ``configs/`` or the path of a YAML file anywhere, relative to the
    working directory) with Hydra ``overrides``. A file named like one of ``configs/`` is refused: Hydra would read
    the repository's instead (the launcher refuses it too)."""
    from hydra import compose, initialize_config_dir

    import verl_ext  # noqa: F401  (registers the resolvers the configs use)

    if not is_config_file(config):
        named = CONFIG_DIR / f"{config}.yaml"
        declared = declared_search_path(named) if named.is_file() else []
        local = [search_path_override(declared)] if declared and not sets_search_path(overrides) else []
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
            return compose(config_name=str(config), overrides=[*local, *overrides])
    path = Path(config).expanduser().resolve()
    if not path.is_file():
        raise FileNotFoundError(f"no run config at {path}")
    namesake = CONFIG_DIR / f"{path.stem}.yaml"
    if namesake.is_file() and path != namesake.resolve():
        raise ValueError(f"{path}: configs/{namesake.name} of the repository has its name; Hydra would read that")
    searchpath = [*(declared_search_path(path) or [VERL_CONFIGS]), f"file://{CONFIG_DIR}"]
    local = [] if sets_search_path(overrides) else [search_path_override(searchpath)]
    with initialize_config_dir(config_dir=str(path.parent), version_base=None):
        return compose(config_name=path.stem, overrides=[*local, *overrides])
