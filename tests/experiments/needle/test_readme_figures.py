"""The README's summary of the CPU replication ("The replication on a CPU machine") quotes the committed runs of
docs/replication_cpu/ (the needle task's and the choosing task's): each figure is recomputed here from the run's
summary.csv and timing.jsonl (the helpers of test_committed_run.py, which read them with the csv and json modules),
so the summary cannot keep the figures of a run that was replaced."""

from __future__ import annotations

import re
from pathlib import Path

from test_committed_run import RUN, per_seed, stage_seconds

README = Path(__file__).resolve().parents[3] / "README.md"
TRAINING = (1, 2, 4)  # the RL runs' document lengths, in chunks


def summary() -> str:
    """The README's section on the replication, on one line."""
    text = README.read_text().split("## The replication on a CPU machine", 1)[1].split("\n## ", 1)[0]
    return " ".join(text.split())


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def test_the_needle_figures_are_the_committed_runs():
    text = summary()
    seeds = per_seed(RUN)
    rl = sorted({model for model, _ in seeds if model.startswith("rl-seed")})
    assert rl == ["rl-seed0", "rl-seed1"]
    warm = mean([seeds[("warm-start", n)] for n in TRAINING])
    lifted = mean([mean([seeds[(model, n)] for model in rl]) for n in TRAINING])
    quoted = re.search(r"training lengths \(1-4 chunks\) from ([\d.]+)% to ([\d.]+)% \(mean of two seeds\)", text)
    assert quoted and quoted.groups() == (f"{warm:.1f}", f"{lifted:.1f}")
    longest = max(n for _, n in seeds)
    at = re.search(
        rf"at {longest} chunks, .*? seed 0 reads ([\d.]+)% and seed 1 ([\d.]+)%, "
        r"where the warm start falls to ([\d.]+)%",
        text,
    )
    want = (seeds[("rl-seed0", longest)], seeds[("rl-seed1", longest)], seeds[("warm-start", longest)])
    assert at and at.groups() == tuple(f"{value:.1f}" for value in want)
    # The ablations: the most either rises over the warm start at one length.
    ablations = {model for model, _ in seeds if model.startswith("ablation")}
    rise = max(seeds[(model, n)] - seeds[("warm-start", n)] for model in ablations for m, n in seeds if m == model)
    assert f"neither variant rises more than {rise:.1f} points over the warm start at any length" in text
    minutes = stage_seconds(RUN)["total"] / 60
    assert f"the run took {minutes:.1f} minutes on 2 cores" in text


def test_the_choosing_figures_are_the_committed_runs():
    text = summary()
    run = RUN / "choose"
    seeds = per_seed(run)
    lengths = sorted(n for model, n in seeds if model == "warm-start")
    warm = [seeds[("warm-start", n)] for n in lengths]
    gap = max(abs(seeds[(m, n)] - seeds[("warm-start", n)]) for m, n in seeds if m.startswith("rl-seed"))
    minutes = stage_seconds(run)["total"] / 60
    quoted = (
        f"warm start {min(warm):.1f}-{max(warm):.1f}% at {lengths[0]}-{lengths[-1]} chunks, each RL seed within "
        f"{gap:.1f} points of it at every length, {minutes:.1f} minutes"
    )
    assert quoted in text
