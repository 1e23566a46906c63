"""The replication runs committed in docs/replication_cpu/ (docs/replication_cpu.md, "The run from one command":
the needle task; "The choosing task: not reached": docs/replication_cpu/choose/): each table is the harness's results
summary it was made from, recomputed here by an independent route (the summary's CSV read with the csv module, seeds
averaged by hand), and the runs' stage times add up to the wall time they state."""

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
# docs/replication_cpu_notebook.md, "The cause: the tokenizer's corpus": a warm start and RL seed 0 of each recipe
CAUSE = RUN / "cause"
RECIPE4 = RUN / "recipe4"  # the notebook's "Recipe 4's default run": the committed run before recipe 5's
RECIPE5 = RUN / "recipe5"  # the notebook's "Recipe 5's default run": the committed run before recipe 6's
# The notebook's "Recipe 6's first default run": the committed run before today's, its policies served in bf16.
RECIPE6_BF16 = RUN / "recipe6_bf16"
RECIPE6_BF16_SECTION = "Recipe 6's first default run: the policies served in bf16"
# The notebook's "Recipe 6's second default run": the committed run before today's, its RL runs one after another.
RECIPE6_FP32 = RUN / "recipe6_fp32"
RECIPE6_FP32_SECTION = "Recipe 6's second default run: the runs one after another"
# The default run, the runs it replaced (recipe 5's, recipe 4's; recipe 2's, the notebook's first part), the choosing
# task's, the cause's runs.
RUNS = [
    RUN,
    RECIPE6_FP32,
    RECIPE6_BF16,
    RECIPE5,
    RECIPE4,
    RUN / "recipe2",
    RUN / "choose",
    RUN / "choose" / "first_run",
    CAUSE / "default",
    CAUSE / "try",
    CAUSE / "keys0",
]
RUNS += [RUN / "another_machine" / "answer_rl", RUN / "another_machine" / "answer_rl_seed1"]  # "The build on another
# machine"
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


def stage_seconds(run: Path) -> dict[str, int]:
    """Stage -> seconds, for a run of one invocation."""
    (group,) = invocations(run)
    return {stage["stage"]: stage["seconds"] for stage in group}


# Each run's invocations, True where it ended with its "total" line: recipe 4's first was stopped in its evaluation
# before the pipeline recorded stopped stages (the notebook says so); the default runs are one invocation each.
ENDED = {
    RUN: [True],
    RECIPE6_FP32: [True],
    RECIPE6_BF16: [True],
    RECIPE5: [True],
    RECIPE4: [False, True, True],
    RUN / "choose": [True],
}


@pytest.mark.parametrize("run", ENDED, ids=lambda run: run.relative_to(RUN.parent).as_posix())
def test_the_stage_times_add_up_to_the_stated_wall_time(run):
    groups = invocations(run)
    runs = [json.loads(line) for line in (run / "run.jsonl").read_text().splitlines()]
    assert len(groups) == len(runs) >= 1  # one line of run.jsonl per invocation of the script
    assert all(s["rc"] == 0 for group in groups for s in group)
    assert [group[-1]["stage"] == "total" for group in groups] == ENDED[run]
    ended = [group for group in groups if group[-1]["stage"] == "total"]
    for group in ended:  # an invocation's stages run one after another inside its total
        stages = group[:-1]
        if any(s["stage"] == "rl_runs" for s in stages):  # but its RL runs side by side, each inside rl_runs
            (together,) = [s["seconds"] for s in stages if s["stage"] == "rl_runs"]
            assert all(s["seconds"] <= together for s in stages if s["stage"].startswith("rl:"))
            stages = [s for s in stages if not s["stage"].startswith("rl:")]
        assert sum(s["seconds"] for s in stages) <= group[-1]["seconds"]
    wall = sum(group[-1]["seconds"] for group in ended)
    assert f"stages 1-5 of every invocation: {wall} s" in (run / "replication.md").read_text()
    assert all(not r["commit"].endswith("+changes") for r in runs)  # a committed tree ran


PAGE = RUN.parent / "replication_cpu.md"
NOTEBOOK = RUN.parent / "replication_cpu_notebook.md"
# The notebook's sections that hold what the page said about its run's history (moved there to keep the page one page)
CAUSE_SECTION = "The cause: the tokenizer's corpus"
LINEAGE_SECTION = "The committed run's lineage: three builds, one reader, and why recipe 6"
PAGE_WORDS = 1500  # the one-page result's bound, counted as `wc -w` counts


def section(path: Path, heading: str) -> str:
    """The text of a page's ``## heading`` section, up to the next section of that level."""
    text = path.read_text()
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else len(text)]


def recipe4_section() -> str:
    return section(NOTEBOOK, "Recipe 4's default run")


def recipe5_section() -> str:
    return section(NOTEBOOK, "Recipe 5's default run")


def recipe6_bf16_section() -> str:
    return section(NOTEBOOK, RECIPE6_BF16_SECTION)


def recipe6_fp32_section() -> str:
    return section(NOTEBOOK, RECIPE6_FP32_SECTION)


def page_table(text: str, title: str = "Strict accuracy (%)") -> tuple[list[int], dict[str, list[float | None]]]:
    """The lengths and rows of the first table under ``**title**`` (None: not evaluated at that length)."""
    lines = text[text.index(f"**{title}**") :].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    lengths = [int(cell.split()[0]) for cell in lines[start].strip("|").split("|")[2:]]
    rows = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        rows[cells[0]] = [None if cell == NOT_RUN else float(cell) for cell in cells[2:]]
    return lengths, rows


def rl_seeds(run: Path) -> list[str]:
    """The RL seeds a run evaluated, from its summary."""
    return sorted({model.removeprefix("rl-seed") for model, _ in per_seed(run) if model.startswith("rl-seed")})


# Where each run's table is quoted: the default run on docs/replication_cpu.md, recipes 5's and 4's in the notebook.
QUOTED_TABLES = {
    RUN: (lambda: PAGE.read_text(), "Strict accuracy (%)"),
    RECIPE6_FP32: (recipe6_fp32_section, "Recipe 6 in fp32, strict accuracy (%)"),
    RECIPE6_BF16: (recipe6_bf16_section, "Recipe 6 in bf16, strict accuracy (%)"),
    RECIPE5: (recipe5_section, "Recipe 5, strict accuracy (%)"),
    RECIPE4: (recipe4_section, "Recipe 4, strict accuracy (%)"),
}


@pytest.mark.parametrize("run", QUOTED_TABLES, ids=lambda run: run.relative_to(RUN.parent).as_posix())
def test_the_quoted_table_and_seeds_are_the_committed_summarys(run):
    """The docs quote each committed run: its table (a full-context row for every policy at once) and RL seed by
    seed, each number recomputed from the run's summary.csv."""
    read, title = QUOTED_TABLES[run]
    text = read()
    lengths, rows = page_table(text, title)
    expected = summary_means("strict", run)
    full_context = [name for name in {n for n, _ in expected} if name.endswith("full context")]
    assert {"warm start (SFT)", "RL"} <= set(rows)
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
    seeds = per_seed(run)
    start = text.index("RL seed by seed:")
    seed_by_seed = " ".join(text[start : text.index("![strict accuracy", start)].split())
    quotes = re.findall(r"seed (\d) ((?:[\d.]+ /\s+)+[\d.]+)", seed_by_seed)
    assert [seed for seed, _ in quotes] == rl_seeds(run)
    for seed, quoted in quotes:
        values = [float(v.rstrip(".")) for v in re.split(r"\s*/\s*", quoted.strip())]
        for length, value in zip(lengths, values, strict=True):
            assert value == pytest.approx(seeds[(f"rl-seed{seed}", length)], abs=0.051), (seed, length)


def test_the_cause_table_is_the_two_runs_summaries():
    """The notebook's "The cause: the tokenizer's corpus": each row is a policy of docs/replication_cpu/cause/default or
    try, recomputed from that run's summary.csv; the warm starts' validation figures it quotes are their builds'
    own evaluations (docs/replication_cpu/cause/warm_starts/)."""
    page = section(NOTEBOOK, CAUSE_SECTION)
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
    if end < 0:  # the last item: up to the next heading, or the end of the text
        end = text.find("## ", start)
    return text[start : end if end > 0 else len(text)]


def rl_survival_quote(text: str, run: Path) -> None:
    """The prose's "RL writes the needle in W% of documents and keeps it at K% a chunk (L lost of D" and "S% of the
    needles it writes are intact 127 chunks later" are the run's survival.md."""
    row = survival_row(run, "RL")
    quoted = re.search(
        r"RL writes the needle in ([\d.]+)% of documents and keeps it at ([\d.]+)% a chunk \(([\d,]+) lost of ([\d,]+)",
        text,
    ).groups()
    lost = sum(int(n) for n in row["lost: dropped / miscopied / replaced"].split("/"))
    assert quoted == (row["written %"], row["keep rate per chunk %"], f"{lost:,}", f"{int(row['keep decisions']):,}")
    assert f"{row['S(127) %']}% of the needles it writes are intact 127 chunks later" in text


def closest_ablation_gap(run: Path) -> float:
    """The smallest distance, in points, by which an ablation stays under the warm start at one length."""
    means = summary_means("strict", run)
    warm = "warm start (SFT)"
    return min(means[(warm, n)] - means[(name, n)] for name, n in means if name.startswith("ablation"))


# Where each default run's targets and cost are written: today's on docs/replication_cpu.md ("Against the targets",
# "What it costs"), recipe 5's in the notebook's "Recipe 5's default run".
TARGETS = {
    RUN: lambda: PAGE.read_text(),
    RECIPE6_FP32: recipe6_fp32_section,
    RECIPE6_BF16: recipe6_bf16_section,
    RECIPE5: recipe5_section,
}
COSTS = {
    RUN: lambda: section(PAGE, "What it costs"),
    RECIPE6_FP32: recipe6_fp32_section,
    RECIPE6_BF16: recipe6_bf16_section,
    RECIPE5: recipe5_section,
}


@pytest.mark.parametrize("run", TARGETS, ids=lambda run: run.relative_to(RUN.parent).as_posix())
def test_the_targets_are_the_committed_runs(run):
    """ "Against the targets": each RL seed's mean at 1-4 chunks and its figures at 64 / 128 / 256, the ablations'
    distance under the warm start, the warm start at 1 / 2 / 4, the lift, and RL's survival figures, each recomputed
    from the run's summary.csv and survival.md."""
    text = " ".join(TARGETS[run]().split())
    seeds = per_seed(run)
    models = [f"rl-seed{seed}" for seed in rl_seeds(run)]
    assert len(models) >= 2  # the default's two seeds at least
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
    ablations, gap = bullet(text, "Both ablations"), closest_ablation_gap(run)
    # the target: at most 10 points over the warm start at any length; the bullet's verdict is the figures'
    verdict = re.search(r"\+ 10\*\*: (met|not met);", ablations).group(1)
    assert verdict == ("met" if gap >= -10 else "not met")
    if gap >= 0:
        quoted = re.search(r"their closest: ([\d.]+) points under it", ablations).group(1)
    else:  # the bullet quotes how far over the warm start the ablations go at most
        quoted = re.search(r"is at most ([\d.]+) points over the warm start", ablations).group(1)
    assert float(quoted) == pytest.approx(abs(gap), abs=0.051)
    means = summary_means("strict", run)
    warm = "warm start (SFT)"
    quoted = re.search(r"the warm start reads ([\d.]+) / ([\d.]+) / ([\d.]+)% at 1 / 2 / 4 chunks", text).groups()
    assert [float(v) for v in quoted] == pytest.approx([means[(warm, n)] for n in (1, 2, 4)], abs=0.051)
    lift = re.search(r"RL goes from (\d+) to (\d+)% at 1-4 chunks", text)
    rl = sum(means[("RL", n)] for n in (1, 2, 4)) / 3
    assert [int(v) for v in lift.groups()] == [round(sum(means[(warm, n)] for n in (1, 2, 4)) / 3), round(rl)]
    rl_survival_quote(text, run)


def stage_minutes(group: list[dict]) -> dict[str, float]:
    return {s["stage"]: s["seconds"] / 60 for s in group}


RL_RUNS = ("rl-seed0", "rl-seed1", "ablation-same-step-seed0", "ablation-token-mean-seed0")


def before_evaluation(stages: dict[str, float]) -> list[float]:
    """The minutes the page lists before the evaluation: warm start, data (its three stages), then RL seeds 0 and 1
    and the two ablations one after another, or, run side by side, their wall time together (rl_runs) and each
    run's."""
    data = stages["data_train"] + stages["data_test_long"] + stages["data_test"]
    together = [stages["rl_runs"]] if "rl_runs" in stages else []
    return [stages["warm_start"], data, *together, *(stages[f"rl:{run}"] for run in RL_RUNS)]


def memory_turns(run: Path, skip: tuple[str, ...] = ()) -> int:
    """The memory agent's turns in a run's evaluation, counted from summary.csv: a document of n chunks is n + 1."""
    with (run / "summary.csv").open() as f:
        items = [r for r in csv.DictReader(f) if r["method"] == "memory-boxed" and r["model"] not in skip]
    return sum(int(r["n"]) * (int(r["length"]) + 1) for r in items)


@pytest.mark.parametrize("run", COSTS, ids=lambda run: run.relative_to(RUN.parent).as_posix())
def test_the_cost_figures_are_the_committed_runs(run):
    """ "What it costs": the one invocation's stage minutes (timing.jsonl's seconds / 60), its evaluation's memory
    turns and an RL step's parts."""
    cost = " ".join(COSTS[run]().split())
    (group,) = invocations(run)
    stages = stage_minutes(group)
    if "rl_runs" in stages:  # the runs side by side (RL_PARALLEL): their wall time, then each run's
        pattern = (
            r"warm start ([\d.]+) minutes .*?data ([\d.]+), RL and ablations ([\d.]+) \(two runs at a time: RL "
            r"([\d.]+) \+ ([\d.]+), ablations ([\d.]+) \+ ([\d.]+)\), evaluation ([\d.]+): ([\d.]+) minutes in all"
        )
    else:
        pattern = (
            r"warm start ([\d.]+) minutes .*?data ([\d.]+), RL ([\d.]+) \+ ([\d.]+), ablations ([\d.]+) \+ ([\d.]+), "
            r"evaluation ([\d.]+): ([\d.]+) minutes in all"
        )
    quoted = re.search(pattern, cost).groups()
    want = [*before_evaluation(stages), stages["evaluation"], stages["total"]]
    assert [float(v) for v in quoted] == pytest.approx(want, abs=0.051)
    turns = memory_turns(run)
    assert f"The evaluation to 256 chunks is {turns:,} memory turns" in cost
    rate = re.search(r"([\d,]+) turns a minute", cost).group(1)
    assert int(rate.replace(",", "")) == round(turns / stages["evaluation"], -1)
    # an RL step's parts, the mean over every step of the four runs (their metrics.jsonl as the trainer logged them)
    steps = [json.loads(line)["data"] for path in sorted(run.glob("metrics-*.jsonl")) for line in path.open()]
    steps = [data for data in steps if "timing_s/step" in data]  # step 0 is the validation before training
    assert len(steps) == 4 * 30
    quoted = re.search(
        r"an RL step takes ([\d.]+) s .*?sampling the rollouts ([\d.]+) s, the reference policy's log-probs for the KL "
        r"loss ([\d.]+) s, the 16 updates ([\d.]+) s",
        cost,
    ).groups()
    parts = ("step", "gen", "ref", "update_actor")
    want = [sum(data[f"timing_s/{part}"] for data in steps) / len(steps) for part in parts]
    assert [float(v) for v in quoted] == pytest.approx(want, abs=0.051)


def test_recipe4s_figures_are_its_runs():
    """The notebook's "Recipe 4's default run": each seed's 1-4-chunk mean, the one figure over 5 points under it,
    the ablations' distance under the warm start, RL's survival, the warm start's keep rate, and the stage minutes of
    its invocations (the first's stages, the resumed evaluation, the third seed's), each recomputed from its files."""
    text = " ".join(recipe4_section().split())
    seeds = per_seed(RECIPE4)
    means = re.search(r"1-4-chunk mean \(seed 0 ([\d.]+)%, seed 1 ([\d.]+)%, seed 2 ([\d.]+)%\)", text).groups()
    want = [sum(seeds[(f"rl-seed{s}", n)] for n in (1, 2, 4)) / 3 for s in (0, 1, 2)]
    assert [float(v) for v in means] == pytest.approx(want, abs=0.051)
    under = re.search(r"seed 0 at 128 chunks, ([\d.]+) under", text).group(1)
    assert float(under) == pytest.approx(want[0] - seeds[("rl-seed0", 128)], abs=0.051)
    # every other seed and length is within 5 points
    long = [want[s] - seeds[(f"rl-seed{s}", n)] for s in (0, 1, 2) for n in (64, 128, 256)]
    assert sum(gap > 5 for gap in long) == 1
    gap = re.search(r"their closest: ([\d.]+) points under it", text).group(1)
    assert float(gap) == pytest.approx(closest_ablation_gap(RECIPE4), abs=0.051)
    warm_keep = re.search(r"its keep rate is ([\d.]+)% a chunk, RL's", text).group(1)
    assert warm_keep == survival_row(RECIPE4, "warm start (SFT)")["keep rate per chunk %"]
    row = survival_row(RECIPE4, "RL")
    quoted = re.search(r"RL's ([\d.]+)% \(([\d,]+) lost of ([\d,]+) keep decisions .*?; ([\d.]+)% of", text).groups()
    lost = sum(int(n) for n in row["lost: dropped / miscopied / replaced"].split("/"))
    keep, decisions = row["keep rate per chunk %"], f"{int(row['keep decisions']):,}"
    assert quoted == (keep, f"{lost:,}", decisions, row["S(127) %"])
    first, resumed, third = (stage_minutes(group) for group in invocations(RECIPE4))
    quoted = re.search(
        r"warm start ([\d.]+) minutes, data ([\d.]+), RL ([\d.]+) \+ ([\d.]+), ablations ([\d.]+) \+ ([\d.]+): "
        r"([\d.]+) minutes before the evaluation",
        text,
    ).groups()
    stages = before_evaluation(first)
    assert [float(v) for v in quoted] == pytest.approx([*stages, sum(stages)], abs=0.051)
    evaluation = re.search(r"the ablations now stopping at 64 chunks .*?, ([\d.]+) minutes on cores shared", text)
    assert float(evaluation.group(1)) == pytest.approx(resumed["evaluation"], abs=0.051)
    seed2 = re.search(r"RL seed 2 and its evaluation, ([\d.]+) and ([\d.]+) minutes", text).groups()
    assert [float(v) for v in seed2] == pytest.approx([third["rl:rl-seed2"], third["evaluation"]], abs=0.051)
    # the default's policies (two RL seeds; the third came with SEEDS="0 1 2"), and what evaluating the ablations at
    # 128 and 256 chunks too would add: 2 ablations x 32 documents x (129 + 257) turns
    turns = memory_turns(RECIPE4, skip=("rl-seed2",))
    assert (
        f"asking 128 and 256 chunks of the warm start and the RL seeds only, as the issue's table does, is {turns:,}"
        in text
    )
    assert f"Evaluating every policy at every length was {turns + 2 * 32 * (129 + 257):,} turns" in text
    assert (
        "each policy is 8,576 turns at 1-64 chunks" in text
        and 64 * sum(n + 1 for n in (1, 2, 4, 8, 16, 32, 64)) == 8576
    )
    assert "12,352 at 128 and 256" in text and 32 * (129 + 257) == 12352


def survival_row(run: Path, policy: str) -> dict[str, str]:
    """The row of ``policy`` in a run's survival.md, by column name."""
    lines = [line for line in (run / "survival.md").read_text().splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    for line in lines[2:]:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if cells[0] == policy:
            return dict(zip(header, cells, strict=True))
    raise KeyError(policy)


def test_the_cause_survival_figures_are_the_runs():
    """The cause's prose: the try's warm start lost none of its keep decisions (their count quoted), today's loses
    about 2% a chunk (its keep rate)."""
    text = " ".join(section(NOTEBOOK, CAUSE_SECTION).split())
    try_warm = survival_row(CAUSE / "try", "warm start (SFT)")
    assert try_warm["lost: dropped / miscopied / replaced"] == "0 / 0 / 0"
    decisions = re.search(r"never lost one it had written \(([\d,]+) keep decisions\)", text).group(1)
    assert int(decisions.replace(",", "")) == int(try_warm["keep decisions"])
    default_warm = survival_row(CAUSE / "default", "warm start (SFT)")
    lost, kept = default_warm["lost: dropped / miscopied / replaced"], int(default_warm["keep decisions"])
    loss_per_chunk = sum(int(n) for n in lost.split("/")) / kept
    assert f"loses about {round(100 * loss_per_chunk)}% a chunk" in text


def test_the_notebooks_share_of_needles_table_is_its_runs():
    """The notebook's "The teacher's share of needles": the row of 0.25 (recipe 5) and of 0.4 (recipe 4), test
    figures at 1 / 2 / 4 / 16 / 64 chunks of the warm start and RL seeds 0 and 1, recomputed from
    docs/replication_cpu/levers/p_needle_25/summary.csv and recipe 4's run."""
    text = section(NOTEBOOK, "The teacher's share of needles")
    lengths = (1, 2, 4, 16, 64)
    runs = {"0.25 (recipe 5)": (RUN / "levers" / "p_needle_25", "warm-start"), "0.4 (recipe 4": (RECIPE4, "warm-start")}
    for label, (run, warm) in runs.items():
        line = next(line for line in text.splitlines() if line.startswith(f"| {label}"))
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        seeds = per_seed(run)
        for cell, model in zip(cells[2:5], (warm, "rl-seed0", "rl-seed1"), strict=True):
            values = [float(v) for v in cell.split(" / ")]
            assert values == pytest.approx([seeds[(model, n)] for n in lengths], abs=0.051), (label, model)


def test_recipe5s_default_runs_warm_start_scores_as_the_build_it_was_chosen_on():
    """The notebook's "Recipe 5's default run": the run's warm start is, weight for weight, the 0.25 build of "The
    teacher's share of needles", and greedy decoding on the same test documents gives the same figures."""
    ours, chosen = per_seed(RECIPE5), per_seed(RUN / "levers" / "p_needle_25")
    lengths = sorted(n for model, n in chosen if model == "warm-start")
    assert lengths == [1, 2, 4, 16, 64]
    assert [ours[("warm-start", n)] for n in lengths] == [chosen[("warm-start", n)] for n in lengths]


OTHER = RUN / "another_machine"  # the notebook's "The build on another machine"


def build_record(name: str) -> dict:
    """A warm start's build record and its evaluation (``--evaluate``, validation documents)."""
    path = RUN / "levers" / "warm_starts" / "p_needle_25.json" if name == "committed" else OTHER / f"{name}.json"
    return json.loads(path.read_text())


def test_the_other_machines_builds_are_quoted_from_their_records():
    """The notebook's "The build on another machine": its table (strict and needle-in-memory shares at 1 / 2 / 4
    chunks of the committed build, the other machine's, its 300-step variant and the answer stage's), the two builds'
    stop steps and scores, and RL seed 2's validation and rewards, each from the committed records; the notebook's
    "The committed run's lineage" quotes the same strict figures."""
    text = " ".join(section(NOTEBOOK, "The build on another machine").split())
    lines = section(NOTEBOOK, "The build on another machine").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("**The build on another machine (%)**"))
    rows = [line for line in lines[start + 4 :] if line.startswith("|")][:4]
    assert len(rows) == 4
    for row, name in zip(rows, ("committed", "warm_start", "naive300", "answer200"), strict=True):
        lengths = build_record(name)["evaluation"]["lengths"]
        cells = [cell.strip() for cell in row.strip("|").split("|")][1:]
        for cell, metric in zip(cells, ("strict", "needle_in_memory"), strict=True):
            want = [100 * lengths[n][metric] for n in ("1", "2", "4")]
            assert [float(v) for v in cell.split(" / ")] == pytest.approx(want, abs=0.051), (name, metric)
    other, committed = (build_record(name)["build"]["stages"] for name in ("warm_start", "committed"))
    assert [s["stage"] for s in other] == [s["stage"] for s in committed] == ["synth", "needle", "paper", "naive"]
    assert other[0]["curve"][3] == committed[0]["curve"][3] | {"train_min": other[0]["curve"][3]["train_min"]}
    assert other[0]["curve"][4]["tok_acc"] != committed[0]["curve"][4]["tok_acc"]  # parted at step 125
    quoted = re.search(
        r"synth (\d+) \(per-token ([\d.]+); the committed build: (\d+), ([\d.]+)\), needle (\d+) \(exact ([\d.]+); "
        r"(\d+), ([\d.]+)\), paper (\d+) \(([\d.]+); (\d+), ([\d.]+)\), naive its budget of (\d+) \(exact ([\d.]+); "
        r"([\d.]+)\)",
        text,
    ).groups()
    key = ("tok_acc", "exact", "exact")
    want = []
    for i, score in enumerate(key):
        want += [other[i]["steps"], other[i]["final"][score], committed[i]["steps"], committed[i]["final"][score]]
    want += [other[3]["steps"], other[3]["final"]["exact"], committed[3]["final"]["exact"]]
    assert [float(v) for v in quoted] == pytest.approx(want, abs=0.0005)
    assert committed[3]["steps"] == other[3]["steps"]
    assert all(record["build"]["numerics"]["mkl_cbwr"] == "AVX2" for record in map(build_record, ("warm_start",)))
    # RL seed 2 from the other build: greedy validation and the sampled reward, step by step
    steps = [json.loads(line) for line in (OTHER / "metrics-rl-seed2.jsonl").open()]
    validation = {
        s["step"]: s["data"]["val-core/replication_needle/acc/mean@1"]
        for s in steps
        if "val-core/replication_needle/acc/mean@1" in s["data"]
    }
    rewards = {
        s["step"]: round(s["data"]["recurrent/final/acc/mean"], 3)
        for s in steps
        if "recurrent/final/acc/mean" in s["data"]
    }
    assert validation == {0: 0.0, 5: 0.0, 10: 0.0}
    nonzero = {step: r for step, r in rewards.items() if r}
    assert nonzero == {1: 0.016, 10: 0.016} and len(rewards) == 13
    assert (
        "greedy validation 0.0 at steps 0, 5 and 10, sampled reward 0.016 at steps 1 and 10 and 0 at the other 11 of 13"
        in text
    )
    page = " ".join(section(NOTEBOOK, LINEAGE_SECTION).split())
    strict = {
        name: " / ".join(f"{100 * v['strict']:.1f}" for v in build_record(name)["evaluation"]["lengths"].values())
        for name in ("warm_start", "committed", "answer200")
    }
    quoted = f"{strict['warm_start']}% at 1 / 2 / 4 chunks on validation documents, where recipe 5's committed build"
    assert f"{quoted} reads {strict['committed']}" in page
    assert f"a warm start at {strict['answer200']}%" in page


def test_the_answer_stages_rl_run_is_quoted_from_its_files():
    """The notebook's "The build on another machine": the answer stage's RL run, its table, survival figures and
    targets, from docs/replication_cpu/another_machine/answer_rl/ (the RL runs before recipe 6's default run)."""
    run = OTHER / "answer_rl"
    text = section(NOTEBOOK, "The build on another machine")
    lengths, rows = page_table(text, "The answer stage's RL run, strict accuracy (%)")
    seeds = per_seed(run)
    for name, model in (("warm start with the answer stage", "warm-start"), ("RL seed 0 from it", "rl-seed0")):
        assert rows[name] == pytest.approx([seeds[(model, n)] for n in lengths], abs=0.051), name
    flat = " ".join(text.split())
    row = survival_row(run, "RL")
    lost = sum(int(n) for n in row["lost: dropped / miscopied / replaced"].split("/"))
    missed = sum(int(n) for n in row["write missed: dropped / miscopied / replaced"].split("/"))
    quoted = f"RL writes the needle in {row['written %']}% of documents and lost none it wrote (0 of "
    assert lost == 0 and f"{quoted}{int(row['keep decisions']):,} keep decisions); its {missed} missed writes" in flat
    mean = sum(seeds[("rl-seed0", n)] for n in (1, 2, 4)) / 3
    assert f"met ({mean:.1f}, the mean)" in flat
    assert f"({seeds[('rl-seed0', 64)]:.1f}, {mean - seeds[('rl-seed0', 64)]:.1f} under)" in flat
    stages = stage_seconds(run)
    assert f"took {stages['rl:rl-seed0'] / 60:.1f} minutes and the evaluation {stages['evaluation'] / 60:.1f}" in flat


def stage_curves(build: dict) -> list[tuple]:
    """A warm start build's stages as (stage, steps, how it stopped, held-out curve without its timings)."""
    keys = ("step", "train_loss", "tok_acc", "exact", "loss")
    return [
        (s["stage"], s["steps"], s["stopped"], [{k: r[k] for k in keys} for r in s["curve"]]) for s in build["stages"]
    ]


def test_the_answer_stages_second_seed_and_ablations_are_quoted_from_their_files():
    """The notebook's "The build on another machine", "A second seed and the ablations": the second clone's build
    equals the first (stop steps, held-out curves, evaluation but its timings); the table's rows are the two runs'
    summaries; the targets' verdicts are computed here from them; the survival and time figures are the files'."""
    first, second = (
        json.loads((OTHER / f"{name}.json").read_text()) for name in ("answer200", "answer200_second_clone")
    )
    assert stage_curves(first["build"]) == stage_curves(second["build"])
    assert [s[:2] for s in stage_curves(second["build"])] == [
        ("synth", 325),
        ("needle", 50),
        ("paper", 50),
        ("answer", 50),
        ("naive", 146),
    ]

    def scores(record):
        timing = ("wall_s", "tok_per_s")
        return {
            n: {k: v for k, v in by.items() if k not in timing} for n, by in record["evaluation"]["lengths"].items()
        }

    assert scores(first) == scores(second)
    text = section(NOTEBOOK, "The build on another machine")
    flat = " ".join(text.split())
    assert f"in {second['build']['build_wall_s'] / 60:.1f} minutes" in flat
    lengths, rows = page_table(text, "The answer stage: two seeds and the ablations, strict accuracy (%)")
    run1 = OTHER / "answer_rl_seed1"
    seed0, seed1 = per_seed(OTHER / "answer_rl"), per_seed(run1)
    assert all(seed0[("warm-start", n)] == seed1[("warm-start", n)] for n in lengths)  # one warm start, one test set
    quoted = {
        "warm start with the answer stage": (seed1, "warm-start"),
        "RL seed 0": (seed0, "rl-seed0"),
        "RL seed 1": (seed1, "rl-seed1"),
        "ablation: answer credit only, RL's step": (seed1, "ablation-same-step-seed0"),
        "ablation: answer credit only, answer token-mean": (seed1, "ablation-token-mean-seed0"),
    }
    for name, (run, model) in quoted.items():
        assert rows[name] == pytest.approx([run[(model, n)] for n in lengths], abs=0.051), name
    means = {seed: sum(run[(f"rl-seed{seed}", n)] for n in (1, 2, 4)) / 3 for seed, run in ((0, seed0), (1, seed1))}
    assert f"met by each seed (seed 0 {means[0]:.1f}, seed 1 {means[1]:.1f}, the means)" in flat
    assert min(means.values()) >= 95
    assert seed1[("rl-seed1", 64)] >= means[1] - 5 and seed0[("rl-seed0", 64)] < means[0] - 5
    assert f"met by seed 1 ({seed1[('rl-seed1', 64)]:.1f}) and missed by seed 0 by one document" in flat
    assert means[0] - 5 - seed0[("rl-seed0", 64)] < 100 / 64  # one of the 64 documents
    assert all(seed1[("warm-start", n)] <= 50 for n in (1, 2, 4))
    survival = {p: survival_row(run1, p) for p in ("RL", "warm start (SFT)")}
    same_step = survival_row(run1, "ablation: answer credit only, RL's step")
    token_mean = survival_row(run1, "ablation: answer credit only, answer token-mean")
    lost = sum(int(n) for n in survival["RL"]["lost: dropped / miscopied / replaced"].split("/"))
    keep = int(survival["RL"]["keep decisions"])
    assert lost == 0 and f"Seed 1 writes the needle in {survival['RL']['written %']}% of documents" in flat
    assert f"lost none it wrote (0 of {keep:,} keep decisions)" in flat
    assert f"writes the needle in {same_step['written %']}% of documents" in flat
    assert f"the token-mean one in {token_mean['written %']}%" in flat
    rate, ws_rate = (float(r["keep rate per chunk %"]) for r in (token_mean, survival["warm start (SFT)"]))
    assert f"keeps a written needle at {rate:.1f}% a chunk (the warm start: {ws_rate:.1f}%)" in flat
    metrics = [json.loads(line) for line in (run1 / "metrics-ablation-same-step-seed0.jsonl").open()]
    reward = {m["step"]: m["data"]["recurrent/final/reward/mean"] for m in metrics if m["step"]}
    assert f"fell from {reward[1]:.2f} at step 1 to 0 from step 18 on" in flat
    assert reward[17] > 0 and all(reward[step] == 0 for step in range(18, 31))
    minutes = {stage: seconds / 60 for stage, seconds in stage_seconds(run1).items()}
    took = (
        f"RL seed 1 took {minutes['rl:rl-seed1']:.1f} minutes, the ablations "
        f"{minutes['rl:ablation-same-step-seed0']:.1f} and {minutes['rl:ablation-token-mean-seed0']:.1f}, "
        "the evaluation of the four policies at five lengths "
        f"{minutes['evaluation']:.1f}"
    )
    assert took in flat
    for model in ("ablation-same-step-seed0", "ablation-token-mean-seed0"):  # so also the target's warm start + 10
        assert all(seed1[(model, n)] <= seed1[("warm-start", n)] for n in lengths), model


def test_the_longer_choice_stage_is_quoted_from_its_records():
    """The notebook's "The choosing task: a longer choice stage": the probe's curve (whole share and held-out exact
    by step) and the committed route's build (its choice stage's stop and the agent's strict and whole-needle shares
    at 1 / 2 / 4 chunks), from docs/replication_cpu/choose/probes/."""
    probes = RUN / "choose" / "probes"
    text = section(NOTEBOOK, "The choosing task: a longer choice stage")
    lines = [line for line in text.splitlines() if line.startswith("|")]
    steps = [int(cell.replace(",", "")) for cell in lines[0].strip("|").split("|")[1:]]
    curve = {p["step"]: p for p in json.loads((probes / "choice_stage_keys_as_words.json").read_text())["curve"]}
    whole = [float(cell) for cell in lines[2].strip("|").split("|")[1:]]
    exact = [float(cell) for cell in lines[3].strip("|").split("|")[1:]]
    assert whole == pytest.approx([100 * curve[s]["val"]["whole"] for s in steps], abs=0.051)
    assert exact == pytest.approx([curve[s]["exact"] for s in steps], abs=0.0005)
    flat = " ".join(text.split())
    by = curve[1000]["val"]["whole_by_distractors"]
    assert f"{100 * by['1']:.0f} / {100 * by['2']:.0f} / {100 * by['3']:.0f}% with 1 / 2 / 3 other needles" in flat
    record = json.loads((probes / "choice_1000_build.json").read_text())
    choice = next(s for s in record["build"]["stages"] if s["stage"] == "choice")
    assert f"its choice stage stopped at step {choice['steps']} (held-out exact {choice['final']['exact']})" in flat
    lengths = record["evaluation"]["lengths"]
    for metric, words in (("strict", "strict"), ("whole_needle", "whole")):
        quoted = " / ".join(f"{100 * lengths[n][metric]:.1f}" for n in ("1", "2", "4"))
        assert f"{words} {quoted}%" in flat, metric


def test_the_oracle_choice_on_the_memory_prompt_is_quoted_from_its_record():
    """The notebook's "The choosing task: the choice told on the memory prompt": each row's chance and held-out exact
    by step are the probe's curve (docs/replication_cpu/choose/probes/oracle_memory_prompt.json)."""
    record = json.loads((RUN / "choose" / "probes" / "oracle_memory_prompt.json").read_text())
    text = section(NOTEBOOK, "The choosing task: the choice told on the memory prompt")
    lines = [line for line in text.splitlines() if line.startswith("|")]
    steps = [int(cell.split()[-1].replace(",", "")) for cell in lines[0].strip("|").split("|")[1:]]
    for line, distractors in zip(lines[2:], (3, 1), strict=True):
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        curve = {point["step"]: point for point in record["curves"][f"distractors_{distractors}"]}
        assert f"({curve[0]['chance']:.3f})" in cells[0]
        quoted = {step: float(cell) for step, cell in zip(steps, cells[1:], strict=True) if cell}
        assert quoted == {step: curve[step]["exact"] for step in curve if step > 0}, distractors


def test_the_choosing_tasks_section_quotes_its_run():
    """docs/replication_cpu.md, "The choosing task: not reached": each RL seed's accuracy at every length and its
    1-4-chunk mean, the warm start's whole-needle and strict shares, and the run's minutes, from the committed run's
    summary, its warm start's evaluation and its timing.jsonl."""
    choose = RUN / "choose"
    text = " ".join(section(PAGE, "The choosing task: not reached").split())
    with (choose / "summary.csv").open() as f:
        rows = [row for row in csv.DictReader(f) if row["method"] == "memory-boxed"]
    lengths = sorted({int(row["length"]) for row in rows})
    for seed in (0, 1):
        strict = {int(r["length"]): float(r["strict"]) for r in rows if r["model"] == f"rl-seed{seed}"}
        assert f"seed {seed} " + " / ".join(f"{strict[n]:.1f}" for n in lengths) in text
        assert f"{(strict[1] + strict[2] + strict[4]) / 3:.1f}%" in text
    evaluation = json.loads((choose / "warm_start_evaluation.json").read_text())["lengths"]
    for metric in ("whole_needle", "strict"):
        quoted = " / ".join(f"{100 * evaluation[n][metric]:.1f}" for n in ("1", "2", "4"))
        assert quoted in text, metric
    stages = stage_seconds(choose)
    assert f"in {stages['total'] / 60:.1f} minutes" in text
    assert f"({(stages['total'] - stages['warm_start']) / 60:.1f} without it)" in text


def test_the_default_runs_warm_start_is_the_answer_stages_build():
    """docs/replication_cpu.md, "The run from one command": the run's warm start (its cache's build record and
    manifest, committed beside the run) is recipe 6's, with the stop steps the page quotes, and its stages' held-out
    curves are those of the answer stage's build from a fresh clone in the session before
    (another_machine/answer200_second_clone.json)."""
    record = json.loads((RUN / "warm_start.json").read_text())
    manifest = json.loads((RUN / "warm_start_manifest.json").read_text())
    before = json.loads((OTHER / "answer200_second_clone.json").read_text())["build"]
    assert (manifest["name"], manifest["recipe"], manifest["answer"], manifest["p_needle"]) == (
        "replication-reader",
        6,
        200,
        0.25,
    )
    assert stage_curves(record) == stage_curves(before)
    steps = {s["stage"]: s["steps"] for s in record["stages"]}
    assert [(s["stage"], s["steps"]) for s in manifest["built"]["stages"]] == list(steps.items())
    text = " ".join(PAGE.read_text().split())
    quoted = re.search(
        r"stages stopped at synth (\d+), needle (\d+), paper (\d+), answer (\d+), naive its budget of (\d+)", text
    ).groups()
    assert [int(v) for v in quoted] == [steps[s] for s in ("synth", "needle", "paper", "answer", "naive")]
    assert manifest["built"]["stages"][-1]["stopped"] == "budget"


def test_recipe6s_training_table_is_the_runs_metrics():
    """The notebook's "Recipe 6's first default run", its training table: each run's sampled reward at steps 1 / 10 /
    20 / 30, greedy validation at steps 0 and 30 and mean seconds a step, from the run's metrics-<run>.jsonl."""
    text = recipe6_bf16_section()
    lines = text[text.index("**Training**") :].splitlines()
    rows = [line for line in lines if line.startswith("| ") and not line.startswith("| run")]
    files = {
        "RL seed 0": "rl-seed0",
        "RL seed 1": "rl-seed1",
        "ablation, RL's step": "ablation-same-step-seed0",
        "ablation, answer token-mean": "ablation-token-mean-seed0",
    }
    assert [row.split("|")[1].strip() for row in rows] == list(files)
    for row, name in zip(rows, files.values(), strict=True):
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        steps = {m["step"]: m["data"] for m in map(json.loads, (RECIPE6_BF16 / f"metrics-{name}.jsonl").open())}
        reward = [round(steps[s]["recurrent/final/reward/mean"], 2) for s in (1, 10, 20, 30)]
        assert [float(v) for v in cells[1].split(" / ")] == reward, name
        validation = [steps[s]["val-core/replication_needle/acc/mean@1"] for s in (0, 30)]
        assert [float(v) for v in cells[2].split(" -> ")] == pytest.approx(validation, abs=0.0051), name
        seconds = [data["timing_s/step"] for data in steps.values() if "timing_s/step" in data]
        assert float(cells[3]) == pytest.approx(sum(seconds) / len(seconds), abs=0.051), name


def test_recipe6s_survival_figures_are_the_runs():
    """The notebook's "Recipe 6's first default run", "What the run adds": the warm start's and RL's written share
    and keep rate, and RL's losses, from the run's survival.md."""
    text = " ".join(recipe6_bf16_section().split())
    warm, rl = survival_row(RECIPE6_BF16, "warm start (SFT)"), survival_row(RECIPE6_BF16, "RL")
    lost = sum(int(n) for n in rl["lost: dropped / miscopied / replaced"].split("/"))
    assert (
        f"From a warm start that writes the needle in {warm['written %']}% of documents and keeps a written one at "
        f"{warm['keep rate per chunk %']}% a chunk"
    ) in text
    assert (
        f"RL writes it in {rl['written %']}% and keeps it at {rl['keep rate per chunk %']}% a chunk ({lost} lost of "
        f"{int(rl['keep decisions']):,} keep decisions"
    ) in text


def test_the_default_runs_warm_start_reads_as_the_answer_stages_build_did():
    """The same weights give the same table: at the lengths both evaluated, the default run's warm start reads on the
    test documents exactly what the answer stage's build from the session before read there (its RL seed 1 run,
    another_machine/answer_rl_seed1/), and the notebook says so."""
    ours, before = per_seed(RECIPE6_BF16), per_seed(OTHER / "answer_rl_seed1")
    lengths = sorted(n for model, n in before if model == "warm-start")
    assert lengths == [1, 2, 4, 16, 64]
    assert [ours[("warm-start", n)] for n in lengths] == [before[("warm-start", n)] for n in lengths]
    quoted = " / ".join(f"{ours[('warm-start', n)]:.1f}" for n in lengths)
    text = " ".join(recipe6_bf16_section().split())
    assert f"the same figures at 1 / 2 / 4 / 16 / 64 chunks ({quoted}%;" in text


# docs/replication_cpu.md, "Against the targets": seed 2 of recipe 6, evaluated beside recipe 6's second run
THIRD_SEED = RECIPE6_FP32 / "third_seed"


def test_the_third_seed_is_quoted_from_its_summary():
    """ "A third seed": seed 2's strict accuracy at 1 / 2 / 4 chunks, their mean, and at 64 / 128 / 256 chunks, from
    third_seed/summary.csv (complete files only), and the three seeds' means at 1-4 chunks beside it."""
    with (THIRD_SEED / "summary.csv").open() as f:
        rows = [r for r in csv.DictReader(f) if r["method"] == "memory-boxed"]
    assert {r["model"] for r in rows} == {"rl-seed2"}
    assert all(int(r["n"]) == int(r["expected"]) and int(r["failed"]) == 0 for r in rows)
    seed2 = {int(r["length"]): float(r["strict"]) for r in rows}
    assert sorted(seed2) == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    text = " ".join(bullet(PAGE.read_text(), "A third seed").split())
    quoted = re.search(
        r"seed 2 reads ([\d.]+) / ([\d.]+) / ([\d.]+)% at 1 / 2 / 4 chunks \(mean ([\d.]+)\) and ([\d.]+) / ([\d.]+) / "
        r"([\d.]+) at 64 / 128 / 256 chunks",
        text,
    ).groups()
    want = [seed2[1], seed2[2], seed2[4], sum(seed2[n] for n in (1, 2, 4)) / 3, seed2[64], seed2[128], seed2[256]]
    assert [float(v) for v in quoted] == pytest.approx(want, abs=0.051)
    seeds = per_seed(RECIPE6_FP32)
    means = [sum(seeds[(f"rl-seed{s}", n)] for n in (1, 2, 4)) / 3 for s in (0, 1)] + [want[3]]
    quoted = re.search(r"1-4-chunk means ([\d.]+) / ([\d.]+) / ([\d.]+)", text).groups()
    assert [float(v) for v in quoted] == pytest.approx(means, abs=0.051)


def test_the_page_is_one_page_that_opens_with_its_result():
    """docs/replication_cpu.md is the one-page result: at most PAGE_WORDS words (runs of non-whitespace, as `wc -w`
    counts them), its history in the notebook; its opening, before the first section, names no commit and states the
    result, each figure of it recomputed here from the committed run (the lowest RL seed at any length, the minutes)."""
    text = PAGE.read_text()
    assert len(text.split()) <= PAGE_WORDS, len(text.split())
    opening = " ".join(text[: text.index("\n## ")].split())
    assert not re.search(r"`[0-9a-f]{7,40}`", opening)  # no chain of commits before the result
    seeds = per_seed(RUN)
    lowest = min(value for (model, _), value in seeds.items() if model.startswith("rl-seed"))
    assert f"both seeds read at least {lowest:.1f}% of the documents at every length to 256 chunks" in opening
    assert f"the run takes {stage_seconds(RUN)['total'] / 60:.1f} minutes" in opening
    assert "RL goes from" in opening  # the lift, recomputed by test_the_targets_are_the_committed_runs
