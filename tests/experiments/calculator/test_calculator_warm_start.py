"""The calculator's warm start on the shared SFT machinery (experiments/sft.py): a micro build is deterministic
on one thread, its stage logs have the calculator's shape, and a stage of 0 steps trains nothing."""

from dataclasses import replace

import torch

from experiments.calculator import warm_start

# Three stages of a few steps on small pools: seconds of CPU, no accuracy.
MICRO = replace(warm_start.QUICK, name="calculator-reader-test", steps=(3, 0, 3), warmup=(1, 2, 2), transcripts=20)
MICRO = replace(MICRO, held=4, batch=4, eval_every=2)
TIMES = ("train_s", "cpu_s")


def test_a_micro_build_is_deterministic_and_logs_its_stages():
    first_model, _, first = warm_start.train(MICRO, log=lambda _: None)
    second_model, _, second = warm_start.train(MICRO, log=lambda _: None)
    one, two = first_model.state_dict(), second_model.state_dict()
    assert sorted(one) == sorted(two) and all(torch.equal(one[k], two[k]) for k in one)

    def untimed(recipe):
        return [{k: v for k, v in stage.items() if k not in TIMES} for stage in recipe["stages"]]

    assert untimed(first) == untimed(second)
    copy, formats, policy = first["stages"]
    assert [s["stage"] for s in first["stages"]] == ["copy", "format", "policy"]
    # scored every eval_every steps and after the last: steps 2 and 3; a stage of 0 steps is never scored
    assert [p["step"] for p in copy["curve"]] == [2, 3] and formats["curve"] == [] and formats["tokens"] == 0
    assert set(copy["curve"][0]) == {"step", "loss", "copy"}
    assert {"step", "loss", "answer"} <= set(policy["curve"][-1]) <= {"step", "loss", "tool_call", "guess", "answer"}
    assert copy["tokens"] == 3 * 4 * 64  # 3 steps of 4 copy rows, each 64 tokens long
