"""The reward per step of a training run, from verl's file logger (``trainer.logger=[...,file]``): a table on
stdout, the wall time per step with each stage's share (verl's ``timing_s/*``), and a PNG of the curve.

    python scripts/plot_training.py OUT_DIR [--out OUT_DIR/training.png]
    python scripts/plot_training.py metrics.1.jsonl metrics.jsonl [--out curve.png]

A folder means its ``metrics.N.jsonl`` (earlier runs, kept by ``scripts/train_tiny_cpu.sh`` before a resume) in
order of N, then ``metrics.jsonl``. Files are merged per step, later files winning. The training reward is the
final answers' mean reward (``recurrent/final/reward/mean``; ``critic/score/mean`` for runs without it); the plot
names the run's reward function, read from the run folder's newest Hydra config (``hydra/*/.hydra/config.yaml``).
"""

from __future__ import annotations

import argparse
import json
import math
import re
from pathlib import Path

import yaml

# Metric names before and after the trainer's metrics were named for the framework ("memagent/" in older runs).
REWARD_KEYS = ("recurrent/final/reward/mean", "memagent/final/reward/mean", "critic/score/mean")
ACC_KEYS = ("recurrent/final/acc/mean", "memagent/final/acc/mean")
KL_KEY = "actor/kl_loss"
# verl's timers inside `timing_s/step` (trainer_base.py fit/_step_once; update_weights: trainer_sync.py).
STAGES = ("gen", "reward", "old_log_prob", "ref", "adv", "update_actor", "update_weights", "save_checkpoint")
_VAL = re.compile(r"^val-(?:core|aux)/([^/]+)/(reward|acc)/mean@(\d+)$")
# The paper's strict verifier, as configs/memory_agent.yaml names it (or by its file).
STRICT_VERIFIER = ("pkg://taskutils.verifiers.strict", "taskutils/verifiers/strict.py")


def reward_function(config: dict) -> tuple[str | None, str | None]:
    """The (path, name) of the reward function a run's resolved config makes verl load: the top-level
    ``custom_reward_function`` where any of its values is set (verl moves it over the other one:
    ``experimental/reward_loop/reward_loop.py``, step 3 of ``migrate_legacy_reward_impl``), else
    ``reward.custom_reward_function``."""
    legacy = config.get("custom_reward_function") or {}
    if any(value is not None for value in legacy.values()):
        return legacy.get("path"), legacy.get("name")
    function = (config.get("reward") or {}).get("custom_reward_function") or {}
    return function.get("path"), function.get("name")


def reward_label(config: dict | None) -> str:
    """What the run's final-answer verdict (``acc``) is called in the plot: "strict verifier" for the paper's strict
    verifier, else the reward function's name, else "reward" (no config found, or verl's own scorer by data source)."""
    if config is None:
        return "reward"
    path, name = reward_function(config)
    if path is None:
        return "reward"
    if path.endswith(STRICT_VERIFIER) and name in (None, "compute_score"):
        return "strict verifier"
    return name or "reward"


def run_config(paths: list[str]) -> dict | None:
    """The newest Hydra config of the run a folder argument names (``hydra/<time>/.hydra/config.yaml``: the launcher's
    ``hydra.run.dir``), or None when no folder holds one."""
    for path in map(Path, paths):
        if path.is_dir():
            configs = sorted(path.glob("hydra/*/.hydra/config.yaml"))
            if configs:
                return yaml.safe_load(configs[-1].read_text())
    return None


def metric_files(paths: list[str]) -> list[Path]:
    files: list[Path] = []
    for path in map(Path, paths):
        if path.is_dir():
            numbered = sorted(path.glob("metrics.*.jsonl"), key=lambda p: int(p.name.split(".")[1]))
            files += [p for p in numbered if p.name.split(".")[1].isdigit()]
            if (path / "metrics.jsonl").is_file():
                files.append(path / "metrics.jsonl")
        else:
            files.append(path)
    return files


def read_steps(files: list[Path]) -> dict[int, dict]:
    """``{step: metrics}`` merged over the files (one JSON line ``{"step": N, "data": {...}}`` per log call)."""
    steps: dict[int, dict] = {}
    for file in files:
        per_file: dict[int, dict] = {}
        for line in file.read_text().splitlines():
            if line.strip():
                record = json.loads(line)
                per_file.setdefault(int(record["step"]), {}).update(record["data"])
        for step, data in per_file.items():
            steps.setdefault(step, {}).update(data)
    return dict(sorted(steps.items()))


def validation(data: dict) -> dict[str, float]:
    """``{"reward[source]": mean@n, "acc[source]": ...}`` for the largest n logged."""
    best: dict[str, tuple[int, float]] = {}
    for key, value in data.items():
        match = _VAL.match(key)
        if match:
            name, n = f"{match.group(2)}[{match.group(1)}]", int(match.group(3))
            if n >= best.get(name, (-1, 0.0))[0]:
                best[name] = (n, float(value))
    return {name: value for name, (_, value) in sorted(best.items())}


def reward_of(data: dict) -> float | None:
    return next((float(data[key]) for key in REWARD_KEYS if key in data), None)


def acc_of(data: dict) -> float | None:
    """The final answers' verdict of one step, under whichever name the run logged it."""
    return next((float(data[key]) for key in ACC_KEYS if key in data), None)


def fmt(value: float | None, width: int = 8) -> str:
    return f"{value:{width}.4f}" if value is not None and math.isfinite(value) else " " * (width - 1) + "-"


def table(steps: dict[int, dict]) -> list[str]:
    val_names = sorted({name for data in steps.values() for name in validation(data)})
    header = f"{'step':>4} {'reward':>8} {'acc':>8} {'kl_loss':>8} {'step_s':>8}" + "".join(
        f" {'val_' + name:>22}" for name in val_names
    )
    lines = [header]
    for step, data in steps.items():
        val = validation(data)
        line = f"{step:>4} {fmt(reward_of(data))} {fmt(acc_of(data))} {fmt(data.get(KL_KEY))} "
        line += fmt(data.get("timing_s/step")) + "".join(f" {fmt(val.get(name), 22)}" for name in val_names)
        lines.append(line)
    return lines


def stage_shares(steps: dict[int, dict], skip_first: bool = True) -> tuple[int, dict[str, float], float] | None:
    """Mean seconds per training step of each stage and of the step, over the steps that trained (the first
    one left out when there are others: it pays one-off warm-up). Returns (steps used, means, mean step)."""
    trained = [data for data in steps.values() if "timing_s/step" in data]
    if skip_first and len(trained) > 1:
        trained = trained[1:]
    if not trained:
        return None
    means = {}
    for stage in (*STAGES, "testing", "dump_rollout_generations"):
        values = [data[f"timing_s/{stage}"] for data in trained if f"timing_s/{stage}" in data]
        if values:
            means[stage] = sum(values) / len(values)
    return len(trained), means, sum(data["timing_s/step"] for data in trained) / len(trained)


def timing_lines(steps: dict[int, dict]) -> list[str]:
    result = stage_shares(steps)
    if result is None:
        return []
    count, means, step = result
    inside = [stage for stage in STAGES if stage in means]
    other = step - sum(means[stage] for stage in inside)
    parts = [f"{stage} {means[stage]:.2f}s ({100 * means[stage] / step:.0f}%)" for stage in inside]
    parts.append(f"other {other:.2f}s ({100 * other / step:.0f}%)")
    lines = [f"wall time per training step (mean of {count} steps): {step:.2f}s = " + ", ".join(parts)]
    outside = [f"{stage} {means[stage]:.2f}s" for stage in ("testing", "dump_rollout_generations") if stage in means]
    if outside:
        lines.append("outside timing_s/step (per step): " + ", ".join(outside))
    return lines


def plot(steps: dict[int, dict], out: Path, reward: str = "reward") -> list[str]:
    """The curve as a PNG; ``reward`` names the run's reward function in the legend (``reward_label``). Returns the
    legend's labels."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    train = [(step, reward_of(data)) for step, data in steps.items() if reward_of(data) is not None]
    if train:
        ax.plot(*zip(*train, strict=True), marker="o", markersize=3, label="train: final-answer reward")
    acc = [(step, acc_of(data)) for step, data in steps.items() if acc_of(data) is not None]
    if acc:
        ax.plot(*zip(*acc, strict=True), linestyle=":", label=f"train: {reward} (acc)")
    val_names = sorted({name for data in steps.values() for name in validation(data)})
    for name in val_names:
        points = [(step, validation(data)[name]) for step, data in steps.items() if name in validation(data)]
        ax.plot(*zip(*points, strict=True), linestyle="--", marker="x", markersize=4, label=f"validation: {name}")
    ax.set_xlabel("training step")
    ax.set_ylabel("reward")
    ax.set_title("reward per step")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    legend = ax.get_legend()  # None when nothing was plotted
    labels = [text.get_text() for text in legend.get_texts()] if legend else []
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return labels


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", help="metrics JSONL files, or a run folder")
    parser.add_argument("--out", help="PNG to write (default: none)")
    args = parser.parse_args(argv)
    steps = read_steps(metric_files(args.paths))
    if not steps:
        raise SystemExit("no metrics found")
    print("\n".join(["[plot_training] reward per step:", *table(steps), *timing_lines(steps)]))
    if args.out:
        reward = reward_label(run_config(args.paths))
        plot(steps, Path(args.out), reward)
        print(f"[plot_training] plot: {args.out} (the final answers' verdict by: {reward})")


if __name__ == "__main__":
    main()
