"""What ``python -m verl_ext.plan`` says a sleeping vLLM keeps on each GPU: not 0 GiB (docs/fidelity.md,
"Rollout memory"). The expected lines are written out by hand from the configs' tensor parallelism and
``enforce_eager``."""

from __future__ import annotations

import pytest

from verl_ext.plan import asleep_resident, compose, main


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        # memagent_7b: tensor-parallel 1, CUDA graphs captured.
        ([], "about 1 GiB per GPU (CUDA context, CUDA-graph pool; estimated, not counted above)"),
        (
            ["actor_rollout_ref.rollout.enforce_eager=true"],
            "about 1 GiB per GPU (CUDA context; estimated, not counted above)",
        ),
        (
            ["actor_rollout_ref.rollout.tensor_model_parallel_size=8"],
            "several GiB per GPU (CUDA context, CUDA-graph pool, NCCL and all-reduce buffers; estimated, not counted"
            " above)",
        ),
    ],
)
def test_what_a_sleeping_vllm_keeps(overrides, expected):
    assert asleep_resident(compose("memagent_7b", overrides).actor_rollout_ref.rollout) == expected


def test_the_plan_prints_the_remainder_only_when_vllm_sleeps(capsys):
    main(["--config-name", "memagent_14b", "--no-cost"])  # tensor-parallel 2; the cost: test_vx_cost.py
    lines = capsys.readouterr().out.splitlines()
    held = next(i for i, line in enumerate(lines) if line.startswith("   rollout GiB / GPU:"))
    assert lines[held].endswith("generation 48.0, old_log_prob 0.0, ref 0.0, update_actor 0.0, update_weights 48.0")
    assert lines[held + 1] == (
        "  asleep, vLLM keeps: 1 to 2 GiB per GPU (CUDA context, CUDA-graph pool, NCCL and all-reduce buffers;"
        " estimated, not counted above)"
    )
    main(["--config-name", "memagent_14b", "--no-cost", "actor_rollout_ref.rollout.free_cache_engine=false"])
    out = capsys.readouterr().out
    assert "asleep" not in out and "update_actor 48.0" in out  # no sleep: vLLM keeps its whole share


def test_a_refused_setting_exits_2_with_the_reason(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["--config-name", "memagent_7b", "actor_rollout_ref.actor.shuffle=true"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "[memagent] refused actor settings:" in err and "actor_rollout_ref.actor.shuffle=true" in err
    assert "Traceback" not in err


def test_an_agent_that_does_not_say_its_calls_gets_the_plan_without_rows(capsys):
    """The calculator says neither how many calls a sample makes nor what they cost: the plan prints what needs no
    rows (its config: 8 prompts x n 4, mini-batches of 2 prompts), the rows unknown; the cost exits 2 naming it."""
    main(["--config-name", "calculator_cpu", "--no-cost"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[:8] == [
        "        trajectories: 32",
        " rows_per_trajectory: unknown",
        "                rows: unknown",
        "           minibatch: trajectory",
        "              epochs: 1",
        "             updates: 4",
        "     rows_per_update: unknown",
        "    verl_row_updates: unknown",
    ]
    assert "             unknown: the agent does not say how many calls a sample makes (its calls_per_sample)" in lines
    with pytest.raises(SystemExit) as stop:
        main(["--config-name", "calculator_cpu"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "agent 'calculator' has no step cost model (step_shapes); --no-cost prints the step plan" in err


def test_sampling_values_out_of_their_rule_exit_2_before_the_plan(capsys):
    # rollout.n = 0 divided the step's rows by zero (a traceback); the trainer's preflight rule names the key.
    with pytest.raises(SystemExit) as stop:
        main(["--config-name", "memagent_7b", "--no-cost", "actor_rollout_ref.rollout.n=0"])
    assert stop.value.code == 2
    assert "actor_rollout_ref.rollout.n must be an integer >= 1, got 0" in capsys.readouterr().err
    # n = 1: the plan is printed, with the preflight's warning that GRPO has no group
    main(["--config-name", "memagent_7b", "--no-cost", "actor_rollout_ref.rollout.n=1"])
    out, err = capsys.readouterr()
    assert "warning:" in err and "GRPO" in err and "trajectories" in out
