"""verl's configs on Hydra's search path by their folder (verl_ext/run_config.py, local_search_path): the same
composed config as Hydra's own ``pkg://verl.trainer.config``, without importing verl; the override goes where
Hydra's parser takes it, and a caller's own search path stands."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from verl_ext.main import first_override, local_search_path_argv
from verl_ext.run_config import (
    CONFIG_DIR,
    VERL_CONFIGS,
    compose_run_config,
    local_search_path,
    search_path_override,
)

REPO = Path(__file__).resolve().parents[2]


def test_verl_configs_are_named_by_the_folder_hydra_would_import_them_from():
    import verl.trainer.config  # the independent route: the package Hydra's pkg:// imports

    folder = Path(verl.trainer.config.__file__).parent
    assert local_search_path(VERL_CONFIGS) == f"file://{folder}"
    assert (folder / "ppo_trainer.yaml").is_file()
    assert local_search_path("file://somewhere/else") == "file://somewhere/else"  # other entries stay
    assert local_search_path("pkg://my_pkg.configs") == "pkg://my_pkg.configs"


def test_the_override_quotes_each_entry():
    assert search_path_override(["file:///a b,c", "file:///it's"]) == (
        "hydra.searchpath=['file:///a b,c','file:///it\\'s']"
    )


@pytest.mark.parametrize("name", ["memagent_7b", "tiny_cpu"])
def test_the_composed_config_is_the_one_of_hydras_pkg_route(name):
    ours = compose_run_config(name, ["trainer.total_epochs=2"])
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        theirs = compose(config_name=name, overrides=["trainer.total_epochs=2"])  # pkg://, as the YAML declares
    assert OmegaConf.to_container(ours) == OmegaConf.to_container(theirs)


def test_composing_a_run_config_imports_nothing_of_verl():
    code = (
        "import sys\n"
        "from verl_ext.run_config import compose_run_config\n"
        "config = compose_run_config('memagent_7b', [])\n"
        "assert config.algorithm.adv_estimator == 'grpo'\n"
        "print(sorted(m for m in sys.modules if m == 'verl' or m.startswith('verl.')))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("argv", "index"),
    [
        (["--config-name", "memagent_7b", "a=1", "b=2", "--cfg", "job", "--resolve"], 2),
        (["a=1", "--config-name", "memagent_7b"], 0),
        (["--config-name=memagent_7b", "a=1"], 1),
        (["-cn", "tiny_cpu", "-cd", "/x", "--resolve", "a=1"], 5),
        (["--config-name", "memagent_7b", "--cfg", "job"], 4),
        ([], 0),
    ],
)
def test_the_override_goes_before_the_callers_first(argv, index):
    assert first_override(argv) == index


def test_the_argv_gets_the_declared_path_unless_the_caller_sets_one():
    argv = ["--config-name", "memagent_7b", "trainer.total_epochs=1", "--cfg", "job"]
    given = local_search_path_argv(argv)
    assert given[:2] + given[3:] == argv
    assert given[2] == search_path_override([VERL_CONFIGS]) and given[2].startswith("hydra.searchpath=['file://")
    own = ["--config-name", "memagent_7b", "hydra.searchpath=[pkg://verl.trainer.config]"]
    assert local_search_path_argv(own) == own
