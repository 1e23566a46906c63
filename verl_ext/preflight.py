"""Checks that run on the launching machine before Ray starts and before any GPU is touched.

Every problem found is reported at once (one :class:`PreflightError` listing them): a ``recurrent:`` section that
does not parse (verl_ext/settings.py), a missing data file, a data file without the columns the agent and the
reward need, a model that is neither a local folder nor in the local Hugging Face cache (nothing is downloaded at
run time), an agent whose widest call does not fit verl's row widths, algorithm settings the multi-call path does
not support, actor settings the paper's mini-batch layout cannot honour
(:func:`verl_ext.minibatch.actor_setting_problems`), sampling values out of the rule the endpoint and the
harness apply (:mod:`recurrent.sampling`), ``rollout.n`` below 1 included, and, once all else passes, one trial
episode of the agent against a scripted model (:mod:`verl_ext.agent_probe`).

``python -m verl_ext.preflight CONFIG.yaml [overrides]`` runs these checks on a run config anywhere (composed on
the repository's configs, as the launcher composes it: :func:`compose_run_config`) and starts nothing.
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, open_dict

from recurrent.sampling import SamplingError, check_value
from verl_ext.minibatch import actor_setting_problems
from verl_ext.rollout import Budgets, build_agent, check_budgets
from verl_ext.settings import RecurrentSettings, recurrent_settings


class PreflightError(ValueError):
    """The configuration cannot run; the message lists every problem."""


def _files(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, list | tuple | ListConfig):
        return [str(v) for v in value]
    return [str(value)]


def _is_text(kind: Any) -> bool:
    import pyarrow as pa

    return pa.types.is_string(kind) or pa.types.is_large_string(kind)


def _is_chat(kind: Any) -> bool:
    """A list of messages whose ``role`` and ``content`` are text: what verl's dataset applies the chat template to."""
    import pyarrow as pa

    if not (pa.types.is_list(kind) or pa.types.is_large_list(kind)) or not pa.types.is_struct(kind.value_type):
        return False
    fields = {kind.value_type.field(i).name: kind.value_type.field(i).type for i in range(kind.value_type.num_fields)}
    return all(name in fields and _is_text(fields[name]) for name in ("role", "content"))


# What a column must hold, by the kind its reader expects: (test of the parquet type, what it reads).
COLUMN_KINDS = {
    "chat": (_is_chat, "a list of messages with text 'role' and 'content' (verl applies the chat template to it)"),
    "text": (_is_text, "text"),
}


def data_problems(
    path: str, required: dict[str, str], check_reward: bool = True, kinds: dict[str, str] | None = None
) -> list[str]:
    """Problems with one data file: missing, unreadable, lacking a required column, or a column of the wrong type.

    ``required`` maps a column to what it is for; ``kinds`` maps a column to the kind of value its reader needs
    (:data:`COLUMN_KINDS`): a prompt of integers would pass the column check and have verl filter out every row at
    start-up, ending the run with an unrelated error. ``reward_model`` must hold a ``ground_truth`` field (unless
    ``check_reward`` is off: a second pass over the same file, for the agent's own columns).
    """
    if "://" in path:  # remote storage (hdfs://, s3://): verl copies it locally at run time
        return []
    file = Path(path).expanduser()
    if not file.is_file():
        return [f"data file not found: {file}"]
    if file.suffix != ".parquet":
        return [f"data file {file} is not a parquet file (verl's RLHFDataset reads parquet)"]
    import pyarrow.parquet as pq

    try:
        schema = pq.read_schema(file)
    except Exception as err:
        return [f"cannot read the parquet schema of {file}: {err}"]
    problems = [f"{file} has no column {col!r} ({why})" for col, why in required.items() if col not in schema.names]
    for column, kind in (kinds or {}).items():
        if column in schema.names:
            fits, wanted = COLUMN_KINDS[kind]
            if not fits(schema.field(column).type):
                problems.append(
                    f"{file}: column {column!r} holds {schema.field(column).type}; {required[column]} needs {wanted}"
                )
    if check_reward and "reward_model" in schema.names:
        kind = schema.field("reward_model").type
        fields = [kind.field(i).name for i in range(kind.num_fields)] if hasattr(kind, "num_fields") else []
        if "ground_truth" not in fields:
            problems.append(f"{file}: column 'reward_model' has no field 'ground_truth' (the answers to score)")
    return problems


def preflight(config: DictConfig, load_tokenizer: bool = True) -> None:
    """Raise :class:`PreflightError` if the run cannot work; resolves ``model.path`` to a local folder."""
    problems: list[str] = []
    try:
        settings = recurrent_settings(config)
    except ValueError as err:
        raise PreflightError(f"the run cannot start:\n  - {err}") from err
    if not settings.agent:
        problems.append("recurrent.agent is not set: name the agent to train (e.g. recurrent.agent=memory)")
    algorithm = config.algorithm
    if algorithm.adv_estimator != "grpo":
        problems.append(
            f"algorithm.adv_estimator={algorithm.adv_estimator!r}: only grpo spreads a trajectory's advantage over "
            "its turns in verl 0.9.1 (compute_advantage_for_multi_trajectories); other estimators would treat "
            "every call of a trajectory as an independent response"
        )
    if algorithm.use_kl_in_reward:
        problems.append(
            "algorithm.use_kl_in_reward=true is not supported: the advantage is computed from the final call "
            "only, so the earlier calls' KL would be ignored; use actor_rollout_ref.actor.use_kl_loss"
        )

    try:
        problems += actor_setting_problems(config)
    except ValueError as err:  # recurrent.minibatch itself is not a mode
        problems.append(str(err))

    problems += sampling_problems(config)
    problems += batch_size_problems(config)
    reward = reward_problem(config)
    if reward is not None:
        problems.append(reward)
    single = single_trajectory_problem(config)
    if single is not None and settings.single_trajectory == "refuse":
        problems.append(f"{single} (recurrent.single_trajectory=refuse)")
    elif single is not None:
        print(f"[memagent] warning: {single} (recurrent.single_trajectory=refuse stops here)", file=sys.stderr)

    rollout = config.actor_rollout_ref.rollout
    widest = int(rollout.prompt_length) + int(rollout.response_length)
    if rollout.get("max_model_len") is not None and int(rollout.max_model_len) < widest:
        problems.append(
            f"actor_rollout_ref.rollout.max_model_len={rollout.max_model_len} is below prompt_length + response_length "
            f"= {widest}: the server could not hold the longest turn"
        )

    required = {
        config.data.prompt_key: "verl's prompt column",
        config.data.get("reward_fn_key", "data_source"): "selects the verifier",
        "reward_model": "holds ground_truth",
    }
    for key in ("train_files", "val_files"):
        files = _files(config.data.get(key))
        if not files:
            problems.append(f"data.{key} is not set")
        for path in files:
            problems += data_problems(path, required, kinds={config.data.prompt_key: "chat"})

    model_path = None
    try:
        from recurrent.models import resolve_model_path

        # The launchers take the model as MODEL_PATH; verl_ext.main as the key itself.
        option = "MODEL_PATH=" if os.environ.get("RECURRENT_LAUNCHER") else "actor_rollout_ref.model.path="
        model_path = resolve_model_path(str(config.actor_rollout_ref.model.path), option)
    except Exception as err:
        problems.append(f"actor_rollout_ref.model.path: {err}")
    if model_path is not None:
        with open_dict(config):
            config.actor_rollout_ref.model.path = model_path  # workers load the same local folder
    if settings.agent:
        problems += held_agent_problems(config, settings, model_path, load_tokenizer, required, bool(problems))
    if problems:
        raise PreflightError("the run cannot start:\n  - " + "\n  - ".join(problems))


def held_agent_problems(
    config: DictConfig,
    settings: RecurrentSettings,
    model_path: str | None,
    load_tokenizer: bool,
    required: dict[str, str],
    others: bool,
) -> list[str]:
    """The agent's checks (:func:`agent_problems`), then, when neither they nor the run's ``others`` found a
    problem, its trial episode; the agent's code runs from here on, held whatever it does (verl_ext/agent_guard.py:
    its first import bounded, ``os._exit`` refused)."""
    from verl_ext.agent_guard import exits_refused, import_problem

    with exits_refused():
        stuck = import_problem(settings.agent)
        if stuck is not None:
            return [stuck]
        problems = agent_problems(config, settings, model_path if load_tokenizer else None, required)
        if not problems and not others and settings.preflight_episode and model_path is not None and load_tokenizer:
            problems += episode_problems(config, settings, model_path)
    return problems


@functools.lru_cache(maxsize=4)
def tokenizer_of(model_path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path)


def episode_problems(config: DictConfig, settings: RecurrentSettings, model_path: str) -> list[str]:
    """The agent's trial episode (:mod:`verl_ext.agent_probe`): its one-line problem, if any."""
    from verl_ext.agent_probe import probe_problem

    rollout = config.actor_rollout_ref.rollout
    budgets = Budgets(int(rollout.prompt_length), int(rollout.response_length))
    problem = probe_problem(config, settings, tokenizer_of(model_path), budgets)
    return [problem] if problem else []


# Where the trainer's config holds sampling values, and the rule of recurrent.sampling each one follows.
SAMPLING_KEYS = {
    "actor_rollout_ref.rollout.temperature": "temperature",
    "actor_rollout_ref.rollout.top_p": "top_p",
    "actor_rollout_ref.rollout.top_k": "top_k",
    "actor_rollout_ref.rollout.seed": "seed",
    "actor_rollout_ref.rollout.n": "n",
    "actor_rollout_ref.rollout.response_length": "max_tokens",
    "actor_rollout_ref.rollout.val_kwargs.temperature": "temperature",
    "actor_rollout_ref.rollout.val_kwargs.top_p": "top_p",
    "actor_rollout_ref.rollout.val_kwargs.top_k": "top_k",
    "actor_rollout_ref.rollout.val_kwargs.n": "n",
}


def sampling_problems(config: DictConfig) -> list[str]:
    """Sampling values of the config out of their rule (:data:`SAMPLING_KEYS`), each named by its key. ``n`` below 1
    would have the replay buffer wait for trajectories that never come (verl then fails after validation, naming
    none of this)."""
    from omegaconf import OmegaConf

    problems = []
    for key, rule in SAMPLING_KEYS.items():
        value = OmegaConf.select(config, key)
        if value is None and rule != "n":
            continue  # unset: verl's or the server's default
        try:
            check_value(rule, value, key)
        except SamplingError as err:
            problems.append(str(err))
    return problems


# The batch sizes of a run: required ones (verl divides by them) and those that may be left null (verl's default).
BATCH_SIZE_KEYS = {
    "data.train_batch_size": True,
    "data.val_batch_size": False,
    "data.gen_batch_size": False,
    "actor_rollout_ref.actor.ppo_mini_batch_size": True,
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": False,
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": False,
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": False,
}


def batch_size_problems(config: DictConfig) -> list[str]:
    """Batch sizes that are not whole numbers >= 1 (:data:`BATCH_SIZE_KEYS`): a train_batch_size of 0 or -4 passes
    verl's own checks and fails a minute into the run, with Ray up, in a traceback that names none of them."""
    from omegaconf import OmegaConf

    problems = []
    for key, required in BATCH_SIZE_KEYS.items():
        value = OmegaConf.select(config, key, default=None)
        if value is None and not required:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            problems.append(f"{key}={value!r}: a batch size is a whole number >= 1")
    return problems


def reward_problem(config: DictConfig) -> str | None:
    """An agent's run names its reward function: the generic config leaves it unset (configs/recurrent_trainer.yaml),
    and verl's fallback scores only verl's example datasets, failing minutes into the run on any other data."""
    reward = config.get("reward") or {}
    function = reward.get("custom_reward_function") or {}
    if function.get("path") is not None or (reward.get("reward_model") or {}).get("enable", False):
        return None
    return (
        "reward.custom_reward_function.path is not set: name the agent's reward function in its config "
        "(docs/write_your_own_agent.md, '3. Its config'); verl's own scorer by data_source, for verl's example "
        "datasets, is path=pkg://verl.utils.reward_score with name=default_compute_score"
    )


def single_trajectory_problem(config: DictConfig) -> str | None:
    """What a GRPO run with one trajectory per prompt does (None when n is not 1): verl's GRPO compares the
    trajectories of a prompt, and with one it takes the reward itself as the advantage (mean 0, std 1)."""
    n = config.actor_rollout_ref.rollout.get("n")
    if n != 1 or config.algorithm.adv_estimator != "grpo":
        return None
    return (
        "actor_rollout_ref.rollout.n=1: GRPO has no group to compare a trajectory with, so verl takes its reward "
        "itself as the advantage (no baseline); the paper samples 16 per prompt"
    )


def agent_problems(
    config: DictConfig, settings: RecurrentSettings, model_path: str | None, required: dict[str, str]
) -> list[str]:
    """The agent is unknown or its settings are wrong, the data lack its columns, or (with a model folder, whose
    tokenizer counts tokens) its widest call does not fit verl's rows."""
    from recurrent.interface import load_register

    try:
        register = load_register(settings.agent)
        agent_config = register.make_config(settings.agent_config)
    except (ValueError, TypeError, KeyError, ImportError, AttributeError, FileNotFoundError) as err:
        return [f"recurrent.agent={settings.agent!r}: {err}"]
    columns = {column: f"agent {settings.agent!r} reads it" for column in register.columns_of(agent_config)}
    columns = {column: why for column, why in columns.items() if column not in required}
    # An agent's large columns are its documents, tokenized as text (recurrent/interface.py, WorkflowRegistration).
    large = {column: "text" for column in register.large_columns_of(agent_config) if column in columns}
    problems = []
    for key in ("train_files", "val_files"):
        for path in _files(config.data.get(key)):
            if Path(path).expanduser().is_file():  # a missing file is reported once, by preflight
                problems += data_problems(path, columns, check_reward=False, kinds=large)
    if model_path is None:
        return problems
    rollout = config.actor_rollout_ref.rollout
    try:
        tokenizer = tokenizer_of(model_path)
        check_budgets(
            build_agent(settings, tokenizer), Budgets(int(rollout.prompt_length), int(rollout.response_length))
        )
    except (ValueError, TypeError, OSError, KeyError) as err:
        problems.append(f"agent {settings.agent!r}: {err}")
    return problems


def main(argv: list[str] | None = None) -> None:
    """``python -m verl_ext.preflight CONFIG [overrides...]``: the preflight of a run config, nothing started."""
    import argparse

    from verl_ext.run_config import compose_run_config
    from verl_ext.settings import resolve_agent_file

    parser = argparse.ArgumentParser(
        prog="python -m verl_ext.preflight",
        description="Check a run config as the trainer does before it starts (data, model, agent, its rows, one "
        "trial episode against a scripted model); nothing is started. Exit 0: the run can start; 2: it cannot "
        "(every problem listed).",
    )
    parser.add_argument("config", help="a config of configs/ (a name) or a YAML file anywhere (a path)")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. data.train_files=data/train.parquet")
    args = parser.parse_args(argv)
    try:
        config = compose_run_config(args.config, args.overrides)
        resolve_agent_file(config)  # a relative agent file is read from the working directory
        preflight(config)
    except (PreflightError, ValueError, FileNotFoundError) as err:
        print(f"[memagent] {err}", file=sys.stderr)
        sys.exit(2)
    print(f"[memagent] ready: {config.recurrent.agent} ({args.config})")


if __name__ == "__main__":
    main()
