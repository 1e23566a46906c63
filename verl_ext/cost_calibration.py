"""The step cost model against measured CPU steps (docs/cluster.md, "Calibrated on the CPU trainer").

    python -m verl_ext.cost_calibration RUN_DIR [RUN_DIR ...] [--skip 1]

``RUN_DIR`` is the ``OUT_DIR`` of ``scripts/train_tiny_cpu.sh``: its composed config (``hydra/*/.hydra``), its
training parquet and ``metrics.jsonl`` (verl's ``timing_s/*`` per step, and the measured lengths of the calls before
the answer and of the answer: verl_ext/metrics.py). For every measured step the model is run on that step's
prompts
with those lengths, on a unit device (FLOP and decode steps, not seconds). A CPU rank has no data-sheet peak, so
two constants are fitted on the first run: its FLOP/s over the three training passes (old log-probs, reference,
update), and the seconds of a decode step of the rollout. The check is the shares: within a run the three training
passes' shares follow from the FLOP model alone; the rollout's share, and every share of a further run, are
predicted with the first run's constants.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from recurrent.options import check_yaml
from verl_ext.cost import PHASES, TRAINING_PHASES, Cluster, Device, StepCost, step_cost
from verl_ext.cost_report import CostInputs, default_args, train_file

UNIT = Device("unit: FLOP and decode steps", 1.0, 1e30, 0.0)
# The trainer's per-trajectory metrics (verl_ext/metrics.py): the answer's mean length, and the mean length
# of the
# calls before it, by the kind the agent gives them.
ANSWER_LENGTH = "recurrent/final/response_length/mean"
CALL_LENGTH = re.compile(r"recurrent/calls/(?P<kind>[^/]+)/length/mean")


@dataclass(frozen=True)
class MeasuredStep:
    step: int
    seconds: dict[str, float]  # timing_s/<phase>
    call_tokens: int  # recurrent/calls/<kind>/length/mean (the one kind of call before the answer), rounded
    answer_tokens: int  # recurrent/final/response_length/mean, rounded
    load: str = ""


def measured_lengths(data: dict[str, float], where: str) -> tuple[int, int]:
    """A step's mean generated lengths, rounded: the calls before the answer (one kind: the cost model takes one
    length for them) and the answer."""
    if ANSWER_LENGTH not in data:
        raise ValueError(f"{where}: no {ANSWER_LENGTH} (the trainer's metrics, verl_ext/metrics.py)")
    calls = {match["kind"]: value for key, value in data.items() if (match := CALL_LENGTH.fullmatch(key))}
    if len(calls) != 1:
        found = ", ".join(sorted(calls)) or "none"
        raise ValueError(
            f"{where}: the cost model takes one length for the calls before the answer, from one "
            f"recurrent/calls/<kind>/length/mean; kinds found: {found}"
        )
    return round(next(iter(calls.values()))), round(data[ANSWER_LENGTH])


def read_run(run_dir: Path) -> tuple[DictConfig, list[MeasuredStep]]:
    """The run's composed config (the last Hydra folder) and its measured steps."""
    import verl_ext  # noqa: F401  (the configs' resolvers)

    configs = sorted(run_dir.glob("hydra/*/.hydra/config.yaml"))
    if not configs:
        raise ValueError(f"{run_dir}: no hydra/*/.hydra/config.yaml (not a scripts/train_tiny_cpu.sh OUT_DIR?)")
    check_yaml(configs[-1])  # a ConfigError (a ValueError) before OmegaConf expands what it holds
    config = OmegaConf.load(configs[-1])
    OmegaConf.resolve(config)
    metrics = run_dir / "metrics.jsonl"
    if not metrics.is_file():
        raise ValueError(f"{run_dir}: no metrics.jsonl")
    steps = []
    for number, line in enumerate(metrics.read_text().splitlines(), start=1):
        record = json.loads(line)
        data = record.get("data", {})
        if not all(f"timing_s/{p}" in data for p in PHASES):
            continue
        calls, answer = measured_lengths(data, f"{metrics}, line {number}")
        seconds = {p: float(data[f"timing_s/{p}"]) for p in PHASES}
        steps.append(MeasuredStep(int(record["step"]), seconds, calls, answer))
    if not steps:
        raise ValueError(f"{metrics}: no step with timing_s/{{{','.join(PHASES)}}}")
    return config, steps


def modelled(config: DictConfig, step: MeasuredStep) -> StepCost:
    """The model on a unit device for one measured step (its prompts, its measured generated lengths)."""
    args = default_args(
        data=train_file(config),
        step=step.step,
        call_tokens=step.call_tokens,
        answer_tokens=step.answer_tokens,
        device="cpu",
    )
    inputs = CostInputs(config, args)
    cluster = Cluster(UNIT, inputs.cluster.devices, dict.fromkeys(PHASES, 1.0), 1.0)
    return step_cost(config, inputs.shape, inputs.trajectories(), cluster)


@dataclass(frozen=True)
class Constants:
    flops_per_s: float  # one CPU rank, the training passes
    decode_step_s: float

    def predict(self, cost: StepCost) -> dict[str, float]:
        gen = cost.phases["gen"]
        out = {"gen": gen.seconds / self.flops_per_s + gen.decode_steps * self.decode_step_s}
        out.update({p: cost.phases[p].seconds / self.flops_per_s for p in TRAINING_PHASES})
        return out


def fit(pairs: list[tuple[MeasuredStep, StepCost]]) -> Constants:
    """FLOP/s from the training passes' total time; then the decode step from what the rollout's prefill and
    decode FLOP leave of its measured time."""
    measured = sum(m.seconds[p] for m, _ in pairs for p in TRAINING_PHASES)
    flop_seconds = sum(c.phases[p].seconds for _, c in pairs for p in TRAINING_PHASES)
    rate = flop_seconds / measured
    gen_left = sum(m.seconds["gen"] - c.phases["gen"].seconds / rate for m, c in pairs)
    steps = sum(c.phases["gen"].decode_steps for _, c in pairs)
    return Constants(rate, max(gen_left, 0.0) / steps)


def shares(seconds: dict[str, float]) -> dict[str, float]:
    total = sum(seconds.values())
    return {p: seconds[p] / total for p in PHASES}


def table(name: str, pairs: list[tuple[MeasuredStep, StepCost]], constants: Constants) -> list[str]:
    lines = [
        f"{name}: measured / modelled seconds, shares of the four phases in brackets",
        "| step | " + " | ".join(PHASES) + " |",
        "|---|" + "---|" * len(PHASES),
    ]
    totals_m, totals_p = dict.fromkeys(PHASES, 0.0), dict.fromkeys(PHASES, 0.0)
    for m, c in pairs:
        predicted = constants.predict(c)
        sm, sp = shares(m.seconds), shares(predicted)
        cells = [f"{m.seconds[p]:.1f} / {predicted[p]:.1f} ({sm[p]:.0%} / {sp[p]:.0%})" for p in PHASES]
        lines.append(f"| {m.step} | " + " | ".join(cells) + " |")
        for p in PHASES:
            totals_m[p] += m.seconds[p]
            totals_p[p] += predicted[p]
    sm, sp = shares(totals_m), shares(totals_p)
    cells = [f"{totals_m[p]:.1f} / {totals_p[p]:.1f} ({sm[p]:.0%} / {sp[p]:.0%})" for p in PHASES]
    lines.append("| all | " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="OUT_DIR of scripts/train_tiny_cpu.sh; the first is fitted")
    parser.add_argument("--skip", type=int, default=1, help="leave out the first steps (first-call warm-up; 1)")
    args = parser.parse_args(argv)
    try:
        runs = []
        for run in args.runs:
            config, steps = read_run(run)
            steps = [s for s in steps if s.step > args.skip]
            if not steps:
                raise ValueError(f"{run}: no measured step after the first {args.skip}")
            runs.append((run, [(s, modelled(config, s)) for s in steps]))
    except ValueError as err:
        print(f"[memagent] {err}", file=sys.stderr)
        sys.exit(2)
    constants = fit(runs[0][1])
    print(
        f"fitted on {runs[0][0].name}: {constants.flops_per_s / 1e9:.3g} GFLOP/s per rank (training passes), "
        f"{constants.decode_step_s * 1e3:.3g} ms per decode step"
    )
    for index, (run, pairs) in enumerate(runs):
        print()
        print("\n".join(table(f"{run.name} ({'fitted' if index == 0 else 'predicted'})", pairs, constants)))


if __name__ == "__main__":
    main()
