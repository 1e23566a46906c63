"""The replication's table: policies, the mean over seeds, incomplete files flagged (hand-written results files)."""

import json
from pathlib import Path

from experiments.needle.report import main, write


def results_file(root: Path, length: int, model: str, method: str, strict: list[int], expected: int | None = None):
    folder = root / f"needle_{length}"
    folder.mkdir(parents=True, exist_ok=True)
    lines = [
        {"id": i, "model": model, "strict": s, "sub_em": s, "em": s, "f1": float(s), "pred": "1234"}
        for i, s in enumerate(strict)
    ]
    (folder / f"{model}__{method}.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    meta = {"model": model, "method": method, "expected": expected if expected is not None else len(strict)}
    (folder / f"{model}__{method}.meta.json").write_text(json.dumps(meta))


def test_the_table_averages_seeds_and_names_policies(tmp_path):
    results = tmp_path / "results"
    results_file(results, 1, "warm-start", "memory-boxed", [1, 0, 0, 0])  # 25 %
    results_file(results, 1, "rl-seed0", "memory-boxed", [1, 1, 1, 1])  # 100 %
    results_file(results, 1, "rl-seed1", "memory-boxed", [1, 1, 1, 0])  # 75 %  -> mean 87.5
    results_file(results, 1, "ablation-seed0", "memory-boxed", [0, 1, 0, 0])  # 25 %
    results_file(results, 1, "warm-start", "direct-boxed", [1, 1, 0, 0])  # 50 %
    results_file(results, 64, "rl-seed0", "memory-boxed", [1, 0, 1, 0])  # 50 %
    results_file(results, 64, "rl-seed1", "memory-boxed", [0, 0, 0, 0])  # 0 %   -> mean 25
    paths = write(results)
    table = paths["md"].read_text()
    strict = table.split("**Lenient")[0]
    assert "| policy | seeds | 1 (64 tok) | 64 (4096 tok) |" in strict
    assert "| warm start (SFT) | 1 | 25.0 | – |" in strict
    assert "| RL | 2 | 87.5 | 25.0 |" in strict
    assert "| ablation: final-answer credit only | 1 | 25.0 | – |" in strict
    assert "| warm start, full context | 1 | 50.0 | – |" in strict
    # policy rows in the display order
    order = [strict.index(name) for name in ("warm start (SFT)", "| RL |", "ablation", "warm start, full")]
    assert order == sorted(order)
    csv_lines = paths["csv"].read_text().splitlines()
    assert "RL,rl-seed1,memory-boxed,1,4,75.0,75.0" in csv_lines
    assert "RL,mean,memory-boxed,64,,25.0,25.0" in csv_lines
    assert paths["png"].stat().st_size > 1000
    assert main([str(results)]) == 0


def test_an_incomplete_file_is_flagged_and_fails_the_exit_status(tmp_path, capsys):
    results = tmp_path / "results"
    results_file(results, 2, "warm-start", "memory-boxed", [1, 1], expected=4)  # 2 of 4 items
    assert main([str(results)]) == 1
    assert "| warm start (SFT) | 1 | 100.0* |" in capsys.readouterr().out


def test_no_results_is_an_error(tmp_path, capsys):
    assert main([str(tmp_path)]) == 2
    assert "no needle_<length>" in capsys.readouterr().err


def test_the_two_ablation_variants_are_two_policies(tmp_path):
    # scripts/replicate_cpu.sh names the credit variants' runs ablation-same-step-seed<k>, ablation-token-mean-seed<k>
    results = tmp_path / "results"
    results_file(results, 1, "ablation-same-step-seed0", "memory-boxed", [1, 0, 0, 0])  # 25 %
    results_file(results, 1, "ablation-token-mean-seed0", "memory-boxed", [1, 1, 1, 0])  # 75 %
    results_file(results, 1, "ablation-token-mean-seed1", "memory-boxed", [1, 0, 0, 0])  # 25 % -> mean 50
    strict = write(results)["md"].read_text().split("**Lenient")[0]
    assert "| ablation: answer credit only, RL's step | 1 | 25.0 |" in strict
    assert "| ablation: answer credit only, answer token-mean | 2 | 50.0 |" in strict


def test_the_run_section_sums_the_invocations(tmp_path):
    """A run killed after its warm start and resumed: two invocations, two total lines (600 + 3000 s, by hand
    3600 s = 60.0 min; without the warm start stage, its 900 s build and the 2 s reuse, 2698 s = 45.0 min)."""
    results = tmp_path / "run" / "results"
    results_file(results, 1, "warm-start", "memory-boxed", [1, 0])
    run = tmp_path / "run"
    invocations = [
        {"commit": "abc1234", "command": "STEPS=30 bash scripts/replicate_cpu.sh", "cores": 2, "started": "t0"},
        {
            "commit": "abc1234",
            "command": "STEPS=30 bash scripts/replicate_cpu.sh",
            "cores": 2,
            "started": "t1",
            "processor": "Some CPU @ 2.80GHz",
        },
    ]
    (run / "run.jsonl").write_text("".join(json.dumps(i) + "\n" for i in invocations))
    stages = [("warm_start", 900, 0), ("rl:rl-seed0", 1, 137), ("total", 600, 0), ("warm_start", 2, 0)]
    stages += [("rl:rl-seed0", 1500, 0), ("evaluation", 1400, 0), ("total", 3000, 0)]
    (run / "timing.jsonl").write_text(
        "".join(json.dumps({"stage": s, "seconds": t, "rc": r}) + "\n" for s, t, r in stages)
    )
    assert main([str(results), "--run-dir", str(run)]) == 0
    markdown = (results / "replication.md").read_text()
    assert markdown.count("commit `abc1234`, 2 cores: `STEPS=30 bash scripts/replicate_cpu.sh`") == 1  # no processor
    assert "commit `abc1234`, 2 cores of Some CPU @ 2.80GHz: `STEPS=30 bash scripts/replicate_cpu.sh`" in markdown
    assert "| rl:rl-seed0 | 1 | 0.0 | 137 |" in markdown and "| evaluation | 1400 | 23.3 | 0 |" in markdown
    assert "3600 s (60.0 min)" in markdown and "cached afterwards): 2698 s (45.0 min)" in markdown
    assert "The run" not in write(results)["md"].read_text()  # without --run-dir: the table alone


def test_an_invocation_stopped_without_a_total_is_kept_out_of_the_wall_time(tmp_path):
    """A run stopped in its evaluation before the pipeline recorded stopped stages (no total line), then resumed:
    the wall time is the resumed invocation's 2010 s (33.5 min; without its 3 s warm start, 2007 s = 33.5 min), and
    the stopped one's recorded stages, 480 + 1000 s = 1480 s (24.7 min), are said apart."""
    results = tmp_path / "run" / "results"
    results_file(results, 1, "warm-start", "memory-boxed", [1, 0])
    run = tmp_path / "run"
    invocation = {"commit": "abc1234", "command": "bash scripts/replicate_cpu.sh", "cores": 2, "started": "t"}
    (run / "run.jsonl").write_text(2 * (json.dumps(invocation) + "\n"))
    stages = [("warm_start", 480, 0), ("rl:rl-seed0", 1000, 0), ("warm_start", 3, 0), ("evaluation", 2000, 0)]
    stages.append(("total", 2010, 0))
    (run / "timing.jsonl").write_text(
        "".join(json.dumps({"stage": s, "seconds": t, "rc": r}) + "\n" for s, t, r in stages)
    )
    assert main([str(results), "--run-dir", str(run)]) == 0
    markdown = (results / "replication.md").read_text()
    assert "every invocation: 2010 s (33.5 min)" in markdown and "cached afterwards): 2007 s (33.5 min)" in markdown
    assert "1 invocation(s) with no total line" in markdown and "took 1480 s (24.7 min)" in markdown
