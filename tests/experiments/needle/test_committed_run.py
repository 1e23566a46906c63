"""The replication runs committed in docs/replication_cpu/ (docs/replication_cpu.md, "The run from one command":
the needle task; "The choosing task": docs/replication_cpu/choose/): each table is the harness's results summary it
was made from, recomputed here by an independent route (the summary's CSV read with the csv module, seeds averaged
by hand), and the needle run's stage times add up to the wall time it states."""

from __future__ import annotations

import csv
import json
import re
from collections import defaultdict
from pathlib import Path

import pytest

# The table's names of the policies (model without its -seed<k>, method) are the report's own; its numbers are not.
from experiments.needle.policies import POLICY_NAMES as NAMES

RUN = Path(__file__).resolve().parents[3] / "docs" / "replication_cpu"
CAUSE = RUN / "cause"  # docs/replication_cpu.md, "The cause": a warm start and RL seed 0 of each recipe
RUNS = [RUN, RUN / "choose", CAUSE / "default", CAUSE / "try", CAUSE / "keys0"]


def summary_means(metric: str, run: Path = RUN) -> dict[tuple[str, int], float]:
    """(policy name, length) -> the mean over the policy's seeds of the summary's per-file accuracy."""
    by_policy: dict[tuple[str, int], list[float]] = defaultdict(list)
    with (run / "summary.csv").open() as f:
        for row in csv.DictReader(f):
            assert int(row["n"]) == int(row["expected"]) and int(row["failed"]) == 0, row  # complete files only
            policy = (re.sub(r"-seed\d+$", "", row["model"]), row["method"])
            by_policy[(NAMES[policy], int(row["length"]))].append(float(row[metric]))
    return {key: sum(values) / len(values) for key, values in by_policy.items()}


def markdown_table(title: str, run: Path = RUN) -> dict[tuple[str, int], float]:
    """(policy name, length) -> the value printed in replication.md's table under ``title``."""
    lines = (run / "replication.md").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"**{title}**"))
    header = [cell.strip() for cell in lines[start + 2].strip("|").split("|")]
    lengths = [int(cell.split()[0]) for cell in header[2:]]
    table = {}
    for line in lines[start + 4 :]:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        for length, value in zip(lengths, cells[2:], strict=True):
            table[(cells[0], length)] = float(value)  # a '*' (incomplete) would fail here: none is committed
    return table


@pytest.mark.parametrize("run", RUNS, ids=lambda run: run.relative_to(RUN.parent).as_posix())
@pytest.mark.parametrize(
    ("metric", "title"), [("strict", "Strict accuracy (%)"), ("sub_em", "Lenient accuracy, sub_em (%)")]
)
def test_the_table_is_the_summary(metric, title, run):
    expected = summary_means(metric, run)
    table = markdown_table(title, run)
    assert set(table) == set(expected)
    for key, value in table.items():
        assert value == pytest.approx(expected[key], abs=0.051), key  # the table rounds to one decimal


@pytest.mark.parametrize("run", RUNS, ids=lambda run: run.relative_to(RUN.parent).as_posix())
def test_the_csv_is_the_summary(run):
    expected = summary_means("strict", run)
    with (run / "replication.csv").open() as f:
        rows = list(csv.DictReader(f))
    means = {(r["policy"], int(r["length"])): float(r["strict"]) for r in rows if r["model"] in ("mean",)}
    singles = defaultdict(list)
    for r in rows:
        if r["model"] != "mean":
            singles[(r["policy"], int(r["length"]))].append(float(r["strict"]))
    for key, values in singles.items():
        value = means.get(key, values[0])  # a policy of one seed has no mean row
        assert value == pytest.approx(expected[key], abs=0.006), key


def test_the_stage_times_add_up_to_the_stated_wall_time():
    stages = [json.loads(line) for line in (RUN / "timing.jsonl").read_text().splitlines()]
    assert all(s["rc"] == 0 for s in stages)
    totals = [s for s in stages if s["stage"] == "total"]
    runs = [json.loads(line) for line in (RUN / "run.jsonl").read_text().splitlines()]
    assert len(totals) == len(runs) >= 1  # one total per invocation of the script
    # Each invocation's stages run one after another inside its total.
    start = 0
    for total in totals:
        end = stages.index(total, start)
        assert sum(s["seconds"] for s in stages[start:end]) <= total["seconds"]
        start = end + 1
    wall = sum(t["seconds"] for t in totals)
    assert f"stages 1-5 of every invocation: {wall} s" in (RUN / "replication.md").read_text()
    assert all(not r["commit"].endswith("+changes") for r in runs)  # a committed tree ran


PAGE = RUN.parent / "replication_cpu.md"


def page_table(text: str) -> tuple[list[int], dict[str, list[float]]]:
    """The lengths and rows of the first table under docs/replication_cpu.md's "**Strict accuracy (%)**"."""
    lines = text[text.index("**Strict accuracy (%)**") :].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    lengths = [int(cell.split()[0]) for cell in lines[start].strip("|").split("|")[2:]]
    rows = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        rows[cells[0]] = [float(cell) for cell in cells[2:]]
    return lengths, rows


def test_the_pages_table_and_seeds_are_the_committed_summarys():
    """docs/replication_cpu.md quotes the committed run: its table (a full-context row for every policy at once)
    and RL seed by seed, each number recomputed from summary.csv."""
    text = PAGE.read_text()
    lengths, rows = page_table(text)
    expected = summary_means("strict")
    full_context = [name for name in {n for n, _ in expected} if name.endswith("full context")]
    for name, values in rows.items():
        for length, value in zip(lengths, values, strict=True):
            if name.startswith("every policy, full context"):
                want = max(expected[(policy, length)] for policy in full_context)
            else:
                want = expected[(name, length)]
            assert value == pytest.approx(want, abs=0.051), (name, length)
    with (RUN / "summary.csv").open() as f:
        per_seed = {
            (r["model"], int(r["length"])): float(r["strict"])
            for r in csv.DictReader(f)
            if r["method"] == "memory-boxed"
        }
    quotes = re.findall(r"seed (\d) ((?:[\d.]+ /\s+)+[\d.]+)", text)
    assert [seed for seed, _ in quotes] == ["0", "1"]
    for seed, quoted in quotes:
        values = [float(v.rstrip(".")) for v in re.split(r"\s*/\s*", quoted.strip())]
        for length, value in zip(lengths, values, strict=True):
            assert value == pytest.approx(per_seed[(f"rl-seed{seed}", length)], abs=0.051), (seed, length)


def test_the_pages_cause_table_is_the_two_runs_summaries():
    """docs/replication_cpu.md, "The cause": each row is a policy of docs/replication_cpu/cause/default or
    try, recomputed from that run's summary.csv; the warm starts' validation figures it quotes are their builds'
    own evaluations (docs/replication_cpu/cause/warm_starts/)."""
    page = PAGE.read_text()
    lines = page[page.index("**Cause, strict accuracy (%)**") :].splitlines()
    text = " ".join(page.split())
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    lengths = [int(cell.split()[0]) for cell in lines[start].strip("|").split("|")[1:]]
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([float(cell) for cell in line.strip("|").split("|")[1:]])
    runs = [summary_means("strict", CAUSE / name) for name in ("default", "try")]
    policies = [(run, policy) for run in runs for policy in ("warm start (SFT)", "RL")]
    assert len(rows) == len(policies) == 4
    for values, (run, policy) in zip(rows, policies, strict=True):
        assert values == pytest.approx([run[(policy, length)] for length in lengths], abs=0.051), policy
    for seed, build in (("1", "seed1"), ("0", "default")):
        evaluation = json.loads((CAUSE / "warm_starts" / f"{build}.json").read_text())["evaluation"]["lengths"]
        quoted = re.search(rf"with seed {seed}, (?:recipe 3 reads )?([\d.]+)%? / ([\d.]+) / ([\d.]+)", text)
        values = [float(v) for v in quoted.groups()]
        assert values == pytest.approx([100 * evaluation[k]["strict"] for k in ("1", "2", "4")], abs=0.051), seed
    at_64 = re.search(
        r"with seed 1 it falls too \(on validation documents, ([\d.]+)% at 64 chunks; with seed 0, ([\d.]+)\)", text
    )
    builds = [json.loads((CAUSE / "warm_starts" / f"{b}.json").read_text()) for b in ("seed1", "default")]
    want = [100 * build["evaluation"]["lengths"]["64"]["strict"] for build in builds]
    assert [float(v) for v in at_64.groups()] == pytest.approx(want, abs=0.051)


def test_the_pages_shortfall_and_cost_figures_are_the_committed_runs():
    """docs/replication_cpu.md's prose figures: the RL and warm-start means it names (from summary.csv) and its stage
    minutes, each the committed timing.jsonl's seconds / 60."""
    text = PAGE.read_text()
    means = summary_means("strict")
    rl = [means[("RL", n)] for n in (1, 2, 4)]
    warm = [means[("warm start (SFT)", n)] for n in (1, 2, 4)]
    short = re.search(
        r"RL ([\d.]+)% at 1-4 chunks\s+\(the two seeds' mean\), ([\d.]+) at 64; the warm start ([\d.]+) at 2", text
    )
    assert [float(v) for v in short.groups()] == pytest.approx(
        [sum(rl) / 3, means[("RL", 64)], means[("warm start (SFT)", 2)]], abs=0.051
    )
    lift = re.search(r"RL goes from (\d+) to (\d+)% at 1-4 chunks", text)
    assert [int(v) for v in lift.groups()] == [round(sum(warm) / 3), round(sum(rl) / 3)]
    seconds = {}
    for line in (RUN / "timing.jsonl").read_text().splitlines():
        stage = json.loads(line)
        seconds[stage["stage"]] = seconds.get(stage["stage"], 0) + stage["seconds"]
    cost = text[text.index("## What it costs") :]
    quoted = re.search(
        r"warm start ([\d.]+) minutes.*?data\s+([\d.]+), RL ([\d.]+) \+ ([\d.]+), ablations ([\d.]+) \+ ([\d.]+), "
        r"evaluation at 1-64 chunks ([\d.]+): ([\d.]+) minutes in all",
        cost,
        flags=re.DOTALL,
    )
    stages = [
        seconds["warm_start"],
        seconds["data_train"] + seconds["data_test"],
        seconds["rl:rl-seed0"],
        seconds["rl:rl-seed1"],
        seconds["rl:ablation-same-step-seed0"],
        seconds["rl:ablation-token-mean-seed0"],
        seconds["evaluation"],
        seconds["total"],
    ]
    assert [float(v) for v in quoted.groups()] == pytest.approx([s / 60 for s in stages], abs=0.051)


def survival_row(run: Path, policy: str) -> dict[str, str]:
    """The row of ``policy`` in a run's survival.md, by column name."""
    lines = [line for line in (run / "survival.md").read_text().splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    for line in lines[2:]:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if cells[0] == policy:
            return dict(zip(header, cells, strict=True))
    raise KeyError(policy)


def test_the_pages_cause_survival_figures_are_the_runs():
    """The cause's prose: the try's warm start lost none of its keep decisions (their count quoted), today's loses
    about 2% a chunk (its keep rate)."""
    text = " ".join(PAGE.read_text().split())
    try_warm = survival_row(CAUSE / "try", "warm start (SFT)")
    assert try_warm["lost: dropped / miscopied / replaced"] == "0 / 0 / 0"
    decisions = re.search(r"never lost one it had written \(([\d,]+) keep decisions\)", text).group(1)
    assert int(decisions.replace(",", "")) == int(try_warm["keep decisions"])
    default_warm = survival_row(CAUSE / "default", "warm start (SFT)")
    lost, kept = default_warm["lost: dropped / miscopied / replaced"], int(default_warm["keep decisions"])
    loss_per_chunk = sum(int(n) for n in lost.split("/")) / kept
    assert f"loses about {round(100 * loss_per_chunk)}% a chunk" in text
