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
# The default run, the recipe-2 run it replaced (the notebook's first part), the choosing task's, the cause's runs.
RUNS = [RUN, RUN / "recipe2", RUN / "choose", CAUSE / "default", CAUSE / "try", CAUSE / "keys0"]
NOT_RUN = "–"  # the report's cell for a policy not evaluated at a length (the ablations over 64 chunks)


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
            if value != NOT_RUN:
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


def invocations(run: Path = RUN) -> list[list[dict]]:
    """The stage lines of timing.jsonl, one list per invocation of the script: each invocation starts with its warm
    start stage (a cached build takes seconds) and ends with its "total" line, but for one stopped by a signal before
    the pipelines recorded that (docs/replication_cpu.md, "The run from one command")."""
    groups: list[list[dict]] = []
    for line in (run / "timing.jsonl").read_text().splitlines():
        stage = json.loads(line)
        if stage["stage"] == "warm_start" or not groups:
            groups.append([])
        groups[-1].append(stage)
    return groups


def test_the_stage_times_add_up_to_the_stated_wall_time():
    groups = invocations()
    runs = [json.loads(line) for line in (RUN / "run.jsonl").read_text().splitlines()]
    assert len(groups) == len(runs) >= 1  # one line of run.jsonl per invocation of the script
    assert all(s["rc"] == 0 for group in groups for s in group)
    # The first invocation was stopped in its evaluation (no total: the page says so); every other one ended.
    assert [group[-1]["stage"] == "total" for group in groups] == [False] + [True] * (len(groups) - 1)
    for group in groups[1:]:  # an invocation's stages run one after another inside its total
        assert sum(s["seconds"] for s in group[:-1]) <= group[-1]["seconds"]
    wall = sum(group[-1]["seconds"] for group in groups[1:])
    assert f"stages 1-5 of every invocation: {wall} s" in (RUN / "replication.md").read_text()
    assert all(not r["commit"].endswith("+changes") for r in runs)  # a committed tree ran


PAGE = RUN.parent / "replication_cpu.md"


def page_table(text: str) -> tuple[list[int], dict[str, list[float | None]]]:
    """The lengths and rows of the first table under docs/replication_cpu.md's "**Strict accuracy (%)**" (None: not
    evaluated at that length)."""
    lines = text[text.index("**Strict accuracy (%)**") :].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    lengths = [int(cell.split()[0]) for cell in lines[start].strip("|").split("|")[2:]]
    rows = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        rows[cells[0]] = [None if cell == NOT_RUN else float(cell) for cell in cells[2:]]
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
                want = max(expected[(policy, length)] for policy in full_context if (policy, length) in expected)
            elif (name, length) not in expected:
                assert value is None, (name, length)  # a policy the run did not evaluate there
                continue
            else:
                want = expected[(name, length)]
            assert value == pytest.approx(want, abs=0.051), (name, length)
    seeds = per_seed()
    seed_by_seed = " ".join(text[text.index("RL seed by seed:") : text.index("![strict accuracy")].split())
    quotes = re.findall(r"seed (\d) ((?:[\d.]+ /\s+)+[\d.]+)", seed_by_seed)
    assert [seed for seed, _ in quotes] == ["0", "1", "2"]
    for seed, quoted in quotes:
        values = [float(v.rstrip(".")) for v in re.split(r"\s*/\s*", quoted.strip())]
        for length, value in zip(lengths, values, strict=True):
            assert value == pytest.approx(seeds[(f"rl-seed{seed}", length)], abs=0.051), (seed, length)


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


def per_seed(run: Path = RUN) -> dict[tuple[str, int], float]:
    """(model, length) -> the memory agent's strict accuracy in summary.csv, each seed's own."""
    with (run / "summary.csv").open() as f:
        return {
            (r["model"], int(r["length"])): float(r["strict"])
            for r in csv.DictReader(f)
            if r["method"] == "memory-boxed"
        }


def bullet(text: str, title: str) -> str:
    """The text of the "Against the targets" item that starts with ``**title``, up to the next item."""
    start = text.index(f"- **{title}")
    end = text.find(" - **", start + 1)
    return text[start : end if end > 0 else text.index("## ", start)]


def test_the_pages_targets_are_the_committed_runs():
    """docs/replication_cpu.md, "Against the targets": each RL seed's mean at 1-4 chunks and its figures at 64 / 128
    / 256, the ablations' distance under the warm start, the warm start at 1 / 2 / 4, the lift, and RL's survival
    figures, each recomputed from summary.csv and survival.md."""
    text = " ".join(PAGE.read_text().split())
    seeds = per_seed()
    models = sorted({model for model, _ in seeds if model.startswith("rl-seed")})
    assert models == ["rl-seed0", "rl-seed1", "rl-seed2"]
    short = re.findall(r"seed (\d) ([\d.]+)%", bullet(text, "Each RL seed"))
    assert [f"rl-seed{seed}" for seed, _ in short] == models
    for seed, quoted in short:
        mean = sum(seeds[(f"rl-seed{seed}", n)] for n in (1, 2, 4)) / 3
        assert float(quoted) == pytest.approx(mean, abs=0.051), seed
    long = re.findall(r"seed (\d) ([\d.]+) / ([\d.]+) / ([\d.]+)", bullet(text, "Within 5 points"))
    assert [f"rl-seed{seed}" for seed, *_ in long] == models
    for seed, *quoted in long:
        want = [seeds[(f"rl-seed{seed}", n)] for n in (64, 128, 256)]
        assert [float(v) for v in quoted] == pytest.approx(want, abs=0.051), seed
    means = summary_means("strict")
    warm = "warm start (SFT)"
    gaps = [means[(warm, n)] - means[(name, n)] for name, n in means if name.startswith("ablation")]
    gap = re.search(r"their closest: ([\d.]+) points under it", text).group(1)
    assert min(gaps) > 0 and float(gap) == pytest.approx(min(gaps), abs=0.051)
    quoted = re.search(r"the warm start reads ([\d.]+) / ([\d.]+) / ([\d.]+)% at 1 / 2 / 4 chunks", text).groups()
    assert [float(v) for v in quoted] == pytest.approx([means[(warm, n)] for n in (1, 2, 4)], abs=0.051)
    lift = re.search(r"RL goes from (\d+) to (\d+)% at 1-4 chunks", text)
    rl = sum(means[("RL", n)] for n in (1, 2, 4)) / 3
    assert [int(v) for v in lift.groups()] == [round(sum(means[(warm, n)] for n in (1, 2, 4)) / 3), round(rl)]
    row = survival_row(RUN, "RL")
    quoted = re.search(
        r"RL writes the needle in ([\d.]+)% of documents and keeps it at ([\d.]+)% a chunk \(([\d,]+) lost of ([\d,]+)",
        text,
    ).groups()
    lost = sum(int(n) for n in row["lost: dropped / miscopied / replaced"].split("/"))
    assert quoted == (row["written %"], row["keep rate per chunk %"], f"{lost:,}", f"{int(row['keep decisions']):,}")
    assert f"{row['S(127) %']}% of the needles it writes are intact 127 chunks later" in text


def test_the_pages_cost_figures_are_the_committed_runs():
    """docs/replication_cpu.md, "What it costs" and "The run from one command": the first invocation's stage minutes
    (timing.jsonl's seconds / 60), the resumed evaluation's, the third seed's, and the default evaluation's memory
    turns, counted from summary.csv: a document of n chunks is n + 1 turns."""
    text = " ".join(PAGE.read_text().split())
    first, resumed = ({s["stage"]: s["seconds"] for s in group} for group in invocations()[:2])
    cost = text[text.index("## What it costs") :]
    quoted = re.search(
        r"warm start ([\d.]+) minutes .*?data ([\d.]+), RL ([\d.]+) \+ ([\d.]+), ablations ([\d.]+) \+ ([\d.]+): "
        r"([\d.]+) minutes before the evaluation",
        cost,
    ).groups()
    stages = [
        first["warm_start"],
        first["data_train"] + first["data_test_long"] + first["data_test"],
        first["rl:rl-seed0"],
        first["rl:rl-seed1"],
        first["rl:ablation-same-step-seed0"],
        first["rl:ablation-token-mean-seed0"],
    ]
    assert [float(v) for v in quoted] == pytest.approx([s / 60 for s in [*stages, sum(stages)]], abs=0.051)
    evaluation = re.search(r"the ablations now stopping at 64 chunks .*?, ([\d.]+) minutes on cores shared", text)
    assert float(evaluation.group(1)) == pytest.approx(resumed["evaluation"] / 60, abs=0.051)
    third = re.search(r"RL seed 2 and its evaluation, ([\d.]+) and ([\d.]+) minutes", text).groups()
    seed2 = {s["stage"]: s["seconds"] for s in invocations()[2]}
    want = [seed2["rl:rl-seed2"] / 60, seed2["evaluation"] / 60]
    assert [float(v) for v in third] == pytest.approx(want, abs=0.051)
    with (RUN / "summary.csv").open() as f:
        # the default's policies (two RL seeds): the third seed came with SEEDS="0 1 2"
        items = [r for r in csv.DictReader(f) if r["method"] == "memory-boxed" and r["model"] != "rl-seed2"]
    turns = sum(int(r["n"]) * (int(r["length"]) + 1) for r in items)
    assert f"The evaluation to 256 chunks is {turns:,} memory turns" in cost
    ablations_long = 2 * 32 * (128 + 1 + 256 + 1)  # what the ablations no longer read over 64 chunks
    assert f"Stopping the ablations at 64 chunks saved {ablations_long:,} turns" in cost


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


def test_the_pages_recipe_5_figures_are_its_runs():
    """docs/replication_cpu.md, "Against the targets": the teacher's share of 0.25 (recipe 5), its warm start at 1 / 2
    / 4 chunks and RL seeds 0 and 1 from it, recomputed from docs/replication_cpu/levers/p_needle_25/summary.csv."""
    text = " ".join(PAGE.read_text().split())
    seeds = per_seed(RUN / "levers" / "p_needle_25")
    warm = re.search(r"its warm start reads ([\d.]+) / ([\d.]+) / ([\d.]+)% at 1 / 2 / 4 chunks", text).groups()
    assert [float(v) for v in warm] == pytest.approx([seeds[("warm-start", n)] for n in (1, 2, 4)], abs=0.051)
    rl = re.search(
        r"RL from it ([\d.]+)% \(seed 0\) and ([\d.]+)% \(seed 1\) at 1-4 chunks, ([\d.]+) and ([\d.]+) at 64 "
        r"\(seed 0 dips to ([\d.]+) at 16\)",
        text,
    ).groups()
    means = [sum(seeds[(f"rl-seed{s}", n)] for n in (1, 2, 4)) / 3 for s in (0, 1)]
    want = [*means, seeds[("rl-seed0", 64)], seeds[("rl-seed1", 64)], seeds[("rl-seed0", 16)]]
    assert [float(v) for v in rl] == pytest.approx(want, abs=0.051)
