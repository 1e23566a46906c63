"""The preflight runs the run's reward function on its trial episode (verl_ext/agent_probe.py).

In training the reward runs in verl's reward-loop workers after the first rollout; a raise there stops the run a
minute in, blamed on the agent's file, its own file and line deep in the Ray log. Here it runs once before the
launch, loaded and called as verl 0.9.1's reward loop does (``verl.trainer.ppo.reward.get_custom_reward_fn``,
then the reward manager's ``compute_score(data_source=, solution_str=, ground_truth=, extra_info=)``,
``verl/experimental/reward_loop/reward_manager/dapo.py:52-93``): the trial's answer decoded from its final row, the
row's ``data_source`` and ``reward_model.ground_truth``, and the ``extra_info`` training builds
(:func:`verl_ext.rollout.reward_extra_info`). A failure is one line naming the reward's file and line::

    my_reward.py:7: KeyError: 'trajectory' (reward my_reward.py:score on the trial episode's answer ...)
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from typing import Any

from omegaconf import DictConfig

from recurrent.failures import describe_failure, describe_import_failure
from verl_ext.rollout import RowOutput, reward_extra_info


def reward_function(config: DictConfig) -> tuple[Any, Any] | None:
    """verl's reward callable of the run and the user's own function inside it (None: verl's scorer by
    ``data_source`` or a reward model, not a function of the run's)."""
    from verl.trainer.ppo.reward import get_custom_reward_fn

    wrapped = get_custom_reward_fn(config)
    if wrapped is None:
        return None
    return wrapped, wrapped.args[0] if getattr(wrapped, "args", None) else wrapped


def score_of(result: Any) -> float | None:
    """The score verl takes from a reward's result (a number, or a dict's ``score``); None when it has none."""
    score = result.get("score") if isinstance(result, dict) else result
    if isinstance(score, bool) or not isinstance(score, int | float) or not math.isfinite(score):
        return None
    return float(score)


def trial_reward_problem(
    config: DictConfig,
    outputs: list[RowOutput],
    row: dict[str, Any],
    tokenizer: Any,
    with_trajectory: bool,
    run_coroutine: Callable[[Any], Any],
) -> str | None:
    """The one-line problem of the run's reward function on the trial episode's rows, or None when it scored;
    ``run_coroutine`` runs an async reward's result to its end (the trial's own event loop)."""
    function = config.reward.custom_reward_function
    what = f"reward {function.path}:{function.name}"
    try:
        loaded = reward_function(config)
    except Exception as err:  # a missing file, a misspelt name, a raise on import
        return f"{describe_import_failure(err)} ({what}: it cannot be loaded, as verl's reward loop loads it)"
    if loaded is None:
        return None
    call, source = loaded
    answer = tokenizer.decode(outputs[-1].response_ids, skip_special_tokens=True)
    where = f"({what}, on the trial episode's answer {answer!r}, as verl's reward loop calls it)"
    try:
        result = call(
            data_source=row.get("data_source"),
            solution_str=answer,
            ground_truth=(row.get("reward_model") or {}).get("ground_truth"),
            extra_info=reward_extra_info(outputs, row, with_trajectory),
        )
        if inspect.isawaitable(result):
            result = run_coroutine(result)
    except Exception as err:
        return f"{describe_failure(err, source if inspect.isfunction(source) else None)} {where}"
    if score_of(result) is None:
        return (
            f"{what} returned {result!r}: verl takes a reward's score as a finite number, or a dict's 'score' {where}"
        )
    return None
