"""Clear errors before Ray starts or any GPU is touched: missing data, missing columns, model, budgets, algorithm."""

from __future__ import annotations

import pandas as pd
import pytest
from vx_helpers import TINY_BUDGETS, compose_config

from verl_ext.preflight import PreflightError, preflight

ROW = {
    "prompt": [{"role": "user", "content": "What is the magic number?"}],
    "context": "The magic number is 42.",
    "data_source": "hotpotqa",
    "reward_model": {"ground_truth": "42", "style": "rule"},
}


def write(path, rows) -> str:
    pd.DataFrame(rows).to_parquet(path)
    return str(path)


def config_for(train: str, val: str, model: str, *extra: str):
    return compose_config(
        "tiny_cpu",
        [
            *TINY_BUDGETS,
            f"data.train_files={train}",
            f"data.val_files={val}",
            f"actor_rollout_ref.model.path={model}",
            *extra,
        ],
    )


def test_a_good_run_passes_and_gets_the_local_model_folder(tmp_path, tiny_model_dir):
    data = write(tmp_path / "train.parquet", [ROW, ROW])
    config = config_for(data, data, "tiny")  # an offline alias, resolved to its folder
    preflight(config)
    assert config.actor_rollout_ref.model.path == tiny_model_dir


def test_every_problem_is_listed_at_once(tmp_path):
    no_context = write(tmp_path / "no_context.parquet", [{k: v for k, v in ROW.items() if k != "context"}])
    no_answer = write(tmp_path / "no_answer.parquet", [{**ROW, "reward_model": {"style": "rule"}}])
    config = config_for(
        no_context,
        f"[{no_answer},{tmp_path / 'missing.parquet'}]",
        "org/not-a-cached-model",
        "algorithm.adv_estimator=rloo",
        "algorithm.use_kl_in_reward=true",
    )
    with pytest.raises(PreflightError) as err:
        preflight(config)
    message = str(err.value)
    assert "no_context.parquet has no column 'context' (agent 'memory' reads it)" in message
    assert "no_answer.parquet: column 'reward_model' has no field 'ground_truth'" in message
    assert "data file not found: " + str(tmp_path / "missing.parquet") in message
    assert "actor_rollout_ref.model.path: model 'org/not-a-cached-model' is neither a local folder" in message
    assert "algorithm.adv_estimator='rloo'" in message and "use_kl_in_reward" in message


def test_budgets_that_do_not_fit_stop_the_run(tmp_path):
    data = write(tmp_path / "train.parquet", [ROW])
    config = config_for(data, data, "tiny", "data.max_prompt_length=200", "actor_rollout_ref.rollout.max_model_len=100")
    with pytest.raises(PreflightError) as err:
        preflight(config)
    assert "rollout.prompt_length (data.max_prompt_length) is 200" in str(err.value)
    assert "max_model_len=100 is below prompt_length + response_length" in str(err.value)
