"""The CPU calibration of the step cost model (verl_ext/cost_calibration.py): the fit by hand, and a run
folder as
scripts/train_tiny_cpu.sh leaves it, read back."""

from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf

from verl_ext.cost import PhaseCost, StepCost
from verl_ext.cost_calibration import MeasuredStep, fit, main, read_run, shares
from verl_ext.plan import compose


def unit_cost(gen: float, steps: int, old: float, ref: float, update: float) -> StepCost:
    """A modelled step on the unit device: seconds are FLOP (the slowest rank's), the rollout's decode steps apart."""
    phases = {
        "gen": PhaseCost("gen", seconds=gen, decode_steps=steps),
        "old_log_prob": PhaseCost("old_log_prob", seconds=old),
        "ref": PhaseCost("ref", seconds=ref),
        "update_actor": PhaseCost("update_actor", seconds=update),
    }
    return StepCost(phases, rows=0, trajectories=0)


def measured(step: int, gen: float, old: float, ref: float, update: float) -> MeasuredStep:
    return MeasuredStep(step, {"gen": gen, "old_log_prob": old, "ref": ref, "update_actor": update}, 16, 8)


def test_the_fit_by_hand():
    pairs = [
        (measured(2, 3.0, 2.0, 2.0, 6.0), unit_cost(100, 10, 200, 200, 600)),
        (measured(3, 2.5, 1.0, 1.0, 3.0), unit_cost(50, 20, 100, 100, 300)),
    ]
    constants = fit(pairs)
    # Training passes: 1,000 + 500 FLOP in 10 + 5 s: 100 FLOP/s. The rollout: (3.0 - 100 / 100) + (2.5 - 50 / 100)
    # = 4 s left for 10 + 20 decode steps: 2/15 s a step.
    assert constants.flops_per_s == pytest.approx(100)
    assert constants.decode_step_s == pytest.approx(4 / 30)
    predicted = constants.predict(pairs[0][1])
    assert predicted == pytest.approx({"gen": 1 + 10 * 4 / 30, "old_log_prob": 2, "ref": 2, "update_actor": 6})
    assert shares({"gen": 1, "old_log_prob": 1, "ref": 0, "update_actor": 2}) == pytest.approx(
        {"gen": 0.25, "old_log_prob": 0.25, "ref": 0, "update_actor": 0.5}
    )


def run_folder(tmp_path, tiny_model_dir, lines: list[dict]):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from experiments.tiny.data import make_memory_rows

    data = tmp_path / "data" / "train.parquet"
    data.parent.mkdir()
    pq.write_table(pa.Table.from_pylist(make_memory_rows(16, "train", seed=0)), data)
    config = compose("tiny_cpu", [f"actor_rollout_ref.model.path={tiny_model_dir}", f"data.train_files={data}"])
    hydra = tmp_path / "hydra" / "20260101-000000" / ".hydra"
    hydra.mkdir(parents=True)
    OmegaConf.save(config, hydra / "config.yaml")
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return tmp_path


def timing(step: int, gen: float, old: float, ref: float, update: float, **extra) -> dict:
    data = {"timing_s/gen": gen, "timing_s/old_log_prob": old, "timing_s/ref": ref, "timing_s/update_actor": update}
    data.update({"recurrent/calls/memory/length/mean": 15.6, "recurrent/final/response_length/mean": 7.4}, **extra)
    return {"step": step, "data": data}


def test_a_run_folder_is_read_and_fitted(tmp_path, tiny_model_dir, capsys):
    lines = [{"step": 0, "data": {"val-core/x": 0.1}}, timing(1, 9.0, 9.0, 9.0, 9.0), timing(2, 3.0, 2.0, 2.0, 6.0)]
    run = run_folder(tmp_path, tiny_model_dir, lines)
    config, steps = read_run(run)
    # Validation-only lines are skipped; the measured lengths are rounded to whole tokens.
    assert [(s.step, s.call_tokens, s.answer_tokens) for s in steps] == [(1, 16, 7), (2, 16, 7)]
    assert steps[1].seconds == {"gen": 3.0, "old_log_prob": 2.0, "ref": 2.0, "update_actor": 6.0}
    main([str(run)])  # step 1 skipped (warm-up): fitted on step 2 alone
    out = capsys.readouterr().out
    # Fitted on one step, the training passes' modelled seconds add up to the measured 10 s, and the rollout's to
    # its measured 3 s (the decode step takes what the FLOP leave).
    row = next(line for line in out.splitlines() if line.startswith("| 2 |"))
    cells = [cell.split(" (")[0] for cell in row.strip("|").split("|")[1:]]
    measured_s, modelled_s = zip(*(tuple(float(x) for x in cell.split(" / ")) for cell in cells), strict=True)
    assert measured_s == (3.0, 2.0, 2.0, 6.0)
    assert modelled_s[0] == pytest.approx(3.0, abs=0.05) and sum(modelled_s[1:]) == pytest.approx(10.0, abs=0.1)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"recurrent/final/response_length/mean": None}, "no recurrent/final/response_length/mean"),
        ({"recurrent/calls/memory/length/mean": None}, "recurrent/calls/<kind>/length/mean; kinds found: none"),
        ({"recurrent/calls/search/length/mean": 20.0}, "kinds found: memory, search"),
    ],
)
def test_a_run_folder_without_the_generated_lengths_is_refused(tmp_path, tiny_model_dir, capsys, change, message):
    """The answer's mean length and one kind of call's before it (several kinds: the model takes one length)."""
    line = timing(2, 3.0, 2.0, 2.0, 6.0)
    for key, value in change.items():
        if value is None:
            del line["data"][key]
        else:
            line["data"][key] = value
    run = run_folder(tmp_path, tiny_model_dir, [line])
    with pytest.raises(SystemExit) as stop:
        main([str(run)])
    assert stop.value.code == 2
    assert f"{run / 'metrics.jsonl'}, line 1: " in (err := capsys.readouterr().err) and message in err


def test_a_missing_run_folder_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        main([str(tmp_path / "elsewhere")])
    assert stop.value.code == 2
    assert "no hydra/*/.hydra/config.yaml" in capsys.readouterr().err
