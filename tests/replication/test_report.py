"""The replication's table: policies, the mean over seeds, incomplete files flagged (hand-written results files)."""

import json
from pathlib import Path

from taskutils.replication.report import main, write


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
