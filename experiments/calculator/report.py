"""The calculator run's summary: the RL curve (training reward, held-out accuracy per step) and the held-out test
accuracy of the warm start and of the RL policy, from the files ``experiments/calculator/run.sh`` writes.

    python -m experiments.calculator.report OUT_DIR      # writes OUT_DIR/summary.json, prints a Markdown table

Reads ``OUT_DIR/rl/metrics*.jsonl`` (verl's file logger; earlier runs' ``metrics.N.jsonl`` first, so a resumed run
reads whole) and ``OUT_DIR/test_eval.jsonl`` (:mod:`experiments.calculator.evaluate`, warm start first).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from experiments.calculator.task import DATA_SOURCE

REWARD = "recurrent/final/reward/mean"  # the final answers' strict reward, mean over the step's trajectories
CALLS = "recurrent/turns_per_sample/mean"  # model calls per trajectory
HELD_OUT = f"val-core/{DATA_SOURCE}/acc/mean@1"  # greedy accuracy on the validation problems
STEP_SECONDS = "timing_s/step"


def read_steps(run_dir: Path) -> dict[int, dict[str, Any]]:
    """verl's metrics of a run folder merged per step (``metrics.N.jsonl`` in order of N, then ``metrics.jsonl``)."""
    numbered = sorted(run_dir.glob("metrics.*.jsonl"), key=lambda p: int(p.name.split(".")[1]))
    files = [p for p in numbered if p.name.split(".")[1].isdigit()] + [run_dir / "metrics.jsonl"]
    steps: dict[int, dict[str, Any]] = {}
    for file in files:
        if file.is_file():
            for line in file.read_text().splitlines():
                if line.strip():
                    record = json.loads(line)
                    steps.setdefault(int(record["step"]), {}).update(record["data"])
    return dict(sorted(steps.items()))


def summarize(out_dir: Path) -> dict[str, Any]:
    steps = read_steps(out_dir / "rl")
    if not steps:
        raise ValueError(f"no training metrics in {out_dir / 'rl'}")
    curve = [
        {
            "step": step,
            "train_reward": data.get(REWARD),
            "calls_per_trajectory": data.get(CALLS),
            "held_out_accuracy": data.get(HELD_OUT),
            "step_s": data.get(STEP_SECONDS),
        }
        for step, data in steps.items()
    ]
    evaluations = [json.loads(line) for line in (out_dir / "test_eval.jsonl").read_text().splitlines()]
    if len(evaluations) != 2:
        raise ValueError(f"{out_dir / 'test_eval.jsonl'} holds {len(evaluations)} evaluations, expected 2")
    timed = [point["step_s"] for point in curve if point["step_s"] is not None]
    return {
        "curve": curve,
        "test": {
            # the model's folder is this machine's path: the policy's name says which it is
            name: {k: v for k, v in result.items() if k not in ("examples", "model")}
            for name, result in zip(("warm_start", "rl"), evaluations, strict=True)
        },
        "steps": max(point["step"] for point in curve),
        "mean_step_s": round(sum(timed) / len(timed), 1) if timed else None,
    }


def markdown(summary: dict[str, Any]) -> list[str]:
    def pct(value: float | None) -> str:
        return "-" if value is None else f"{100 * value:.1f}"

    lines = ["| step | training reward (%) | calls per trajectory | held-out accuracy (%) |", "|---|---|---|---|"]
    for point in summary["curve"]:
        calls = "-" if point["calls_per_trajectory"] is None else f"{point['calls_per_trajectory']:.2f}"
        lines.append(
            f"| {point['step']} | {pct(point['train_reward'])} | {calls} | {pct(point['held_out_accuracy'])} |"
        )
    lines += [
        "",
        "| policy | test accuracy (%) | + | - | * | first call is a tool call (%) |",
        "|---|---|---|---|---|---|",
    ]
    for name, result in summary["test"].items():
        ops = result["by_operator"]
        lines.append(
            f"| {name} | {pct(result['accuracy'])} | {pct(ops['+']['accuracy'])} | {pct(ops['-']['accuracy'])} | "
            f"{pct(ops['*']['accuracy'])} | {pct(result['tool_first'])} |"
        )
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.calculator.report", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("out_dir", type=Path, help="the folder of experiments/calculator/run.sh")
    args = parser.parse_args(argv)
    summary = summarize(args.out_dir)
    (args.out_dir / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print("\n".join(markdown(summary)))


if __name__ == "__main__":
    main()
