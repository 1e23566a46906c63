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


def test_columns_of_the_wrong_type_stop_the_run_naming_the_column(tmp_path):
    """A prompt verl cannot apply a chat template to, or a document that is not text, is named before Ray starts
    (verl would filter out every row and the run would die later with an unrelated error)."""
    numbers = write(tmp_path / "numbers.parquet", [{**ROW, "prompt": 7, "context": 42}])
    plain = write(tmp_path / "plain.parquet", [{**ROW, "prompt": "What is the magic number?"}])
    with pytest.raises(PreflightError) as err:
        preflight(config_for(numbers, plain, "org/not-a-cached-model"))
    message = str(err.value)
    assert (
        f"{numbers}: column 'prompt' holds int64; verl's prompt column needs a list of messages with text 'role' "
        "and 'content' (verl applies the chat template to it)" in message
    )
    assert f"{numbers}: column 'context' holds int64; agent 'memory' reads it needs text" in message
    assert f"{plain}: column 'prompt' holds large_string; verl's prompt column needs a list of messages" in message
    assert f"{plain}: column 'context'" not in message  # the document is text there


def test_budgets_that_do_not_fit_stop_the_run(tmp_path):
    data = write(tmp_path / "train.parquet", [ROW])
    config = config_for(data, data, "tiny", "data.max_prompt_length=200", "actor_rollout_ref.rollout.max_model_len=100")
    with pytest.raises(PreflightError) as err:
        preflight(config)
    assert "rollout.prompt_length (data.max_prompt_length) is 200" in str(err.value)
    assert "max_model_len=100 is below prompt_length + response_length" in str(err.value)


def test_rollout_n_below_one_is_refused_naming_the_key(tmp_path):
    data = write(tmp_path / "train.parquet", [ROW])
    for n in (0, -2):
        with pytest.raises(PreflightError) as err:
            preflight(config_for(data, data, "tiny", f"actor_rollout_ref.rollout.n={n}"), load_tokenizer=False)
        assert f"actor_rollout_ref.rollout.n must be an integer >= 1, got {n}" in str(err.value)
    with pytest.raises(PreflightError) as err:
        preflight(config_for(data, data, "tiny", "actor_rollout_ref.rollout.val_kwargs.n=0"), load_tokenizer=False)
    assert "actor_rollout_ref.rollout.val_kwargs.n must be an integer >= 1, got 0" in str(err.value)
    # null is no count either: verl would wait for trajectories that never come (sampling_problems checks n set or not)
    with pytest.raises(PreflightError) as err:
        preflight(config_for(data, data, "tiny", "actor_rollout_ref.rollout.n=null"), load_tokenizer=False)
    assert "actor_rollout_ref.rollout.n must be an integer >= 1, got None" in str(err.value)


def test_sampling_values_follow_the_endpoints_rule(tmp_path):
    data = write(tmp_path / "train.parquet", [ROW])
    bad = [
        "actor_rollout_ref.rollout.temperature=-0.5",
        "actor_rollout_ref.rollout.top_p=0",
        "actor_rollout_ref.rollout.top_k=-3",
        "actor_rollout_ref.rollout.seed=1.5",
        "actor_rollout_ref.rollout.val_kwargs.temperature=nan",
        "actor_rollout_ref.rollout.val_kwargs.top_p=inf",
    ]
    with pytest.raises(PreflightError) as err:
        preflight(config_for(data, data, "tiny", *bad), load_tokenizer=False)
    listed = [line.strip()[2:] for line in str(err.value).splitlines()[1:]]
    assert listed == [  # every one at once, in the order of the config
        "actor_rollout_ref.rollout.temperature must be a finite number >= 0, got -0.5",
        "actor_rollout_ref.rollout.top_p must be a finite number in (0, 1], got 0",
        "actor_rollout_ref.rollout.top_k must be an integer >= -1, got -3",
        "actor_rollout_ref.rollout.seed must be an integer in [-9223372036854775808, 9223372036854775807], got 1.5",
        "actor_rollout_ref.rollout.val_kwargs.temperature must be a finite number >= 0, got nan",
        "actor_rollout_ref.rollout.val_kwargs.top_p must be a finite number in (0, 1], got inf",
    ]


def test_one_trajectory_per_prompt_is_warned_or_refused(tmp_path, capsys):
    data = write(tmp_path / "train.parquet", [ROW])
    preflight(config_for(data, data, "tiny", "actor_rollout_ref.rollout.n=1"), load_tokenizer=False)
    err = capsys.readouterr().err
    assert "[memagent] warning: actor_rollout_ref.rollout.n=1: GRPO has no group to compare a trajectory with" in err
    assert "(recurrent.single_trajectory=refuse stops here)" in err
    with pytest.raises(PreflightError) as refused:
        preflight(
            config_for(data, data, "tiny", "actor_rollout_ref.rollout.n=1", "recurrent.single_trajectory=refuse"),
            load_tokenizer=False,
        )
    assert "actor_rollout_ref.rollout.n=1: GRPO has no group" in str(refused.value)
    assert "(recurrent.single_trajectory=refuse)" in str(refused.value)
    preflight(config_for(data, data, "tiny", "recurrent.single_trajectory=refuse"), load_tokenizer=False)  # n=4
    assert capsys.readouterr().err == ""
    with pytest.raises(PreflightError, match="recurrent.single_trajectory must be one of warn, refuse, got 'stop'"):
        preflight(config_for(data, data, "tiny", "recurrent.single_trajectory=stop"), load_tokenizer=False)


def test_a_refused_rollout_n_exits_2_before_ray_starts(tmp_path, tiny_model_dir):
    import os
    import subprocess
    import sys

    data = write(tmp_path / "train.parquet", [ROW])
    env = {
        **os.environ,
        "VERL_PLATFORM": "cpu",
        "VERL_USE_EXTERNAL_MODULES": "verl_ext.cpu.load",
        "RAY_ADDRESS": "",
    }
    overrides = [f"data.train_files={data}", f"data.val_files={data}", f"actor_rollout_ref.model.path={tiny_model_dir}"]
    command = [sys.executable, "-m", "verl_ext.main", "--config-name", "tiny_cpu", *TINY_BUDGETS, *overrides]
    result = subprocess.run(
        [*command, "actor_rollout_ref.rollout.n=0", f"hydra.run.dir={tmp_path / 'hydra'}"],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr[-2000:]
    assert "[memagent] the run cannot start:" in result.stderr
    assert "actor_rollout_ref.rollout.n must be an integer >= 1, got 0" in result.stderr
    assert "ray" not in result.stderr.lower()  # stopped before Ray was started


def test_a_run_without_a_reward_function_is_refused_naming_the_key(tmp_path):
    # The generic config leaves the reward to the agent's config; without one, verl's fallback would fail on the
    # first scored trajectory, minutes in. A reward model in its place is a reward too.
    data = write(tmp_path / "train.parquet", [ROW])
    config = config_for(data, data, "tiny", "reward.custom_reward_function.path=null")
    with pytest.raises(PreflightError, match=r"reward.custom_reward_function.path is not set: name the agent's"):
        preflight(config)
    config = config_for(
        data, data, "tiny", "reward.custom_reward_function.path=null", "reward.reward_model.enable=true"
    )
    preflight(config)
