"""A run config composed as the trainer composes it, from anywhere: a name of the repository's ``configs/``, or a
YAML file of your own folder whose ``defaults`` name the repository's configs (``recurrent_trainer``,
``cpu_platform``, ...), as ``scripts/train_tiny_cpu.sh CONFIG=my_agent_cpu.yaml`` and ``python -m verl_ext.main
--config-dir DIR --config-name NAME`` read it (docs/write_your_own_agent.md, "4. Check it against the trainer").

Hydra reads ``hydra.searchpath`` from the primary config only; a file outside ``configs/`` therefore gets the
repository's configs put on its search path here, after the ones it declares itself (verl's, for ``ppo_trainer``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from omegaconf import DictConfig

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"  # the repository's run configs
VERL_CONFIGS = "pkg://verl.trainer.config"  # where verl's ppo_trainer is found


def is_config_file(config: str | Path) -> bool:
    """Whether ``config`` names a YAML file (a path) rather than a config of ``configs/`` (a name)."""
    text = str(config)
    return "/" in text or text.endswith((".yaml", ".yml"))


def compose_run_config(config: str | Path, overrides: Sequence[str] = ()) -> DictConfig:
    """The composed config of ``config`` (a name of ``configs/`` or the path of a YAML file anywhere, relative to the
    working directory) with Hydra ``overrides``. A file named like one of ``configs/`` is refused: Hydra would read
    the repository's instead (the launcher refuses it too)."""
    import yaml
    from hydra import compose, initialize_config_dir

    import verl_ext  # noqa: F401  (registers the resolvers the configs use)

    if not is_config_file(config):
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
            return compose(config_name=str(config), overrides=list(overrides))
    path = Path(config).expanduser().resolve()
    if not path.is_file():
        raise FileNotFoundError(f"no run config at {path}")
    namesake = CONFIG_DIR / f"{path.stem}.yaml"
    if namesake.is_file() and path != namesake.resolve():
        raise ValueError(f"{path}: configs/{namesake.name} of the repository has its name; Hydra would read that")
    declared = ((yaml.safe_load(path.read_text()) or {}).get("hydra") or {}).get("searchpath") or [VERL_CONFIGS]
    searchpath = [*declared, f"file://{CONFIG_DIR}"]
    with initialize_config_dir(config_dir=str(path.parent), version_base=None):
        return compose(config_name=path.stem, overrides=[f"hydra.searchpath=[{','.join(searchpath)}]", *overrides])
