"""The warm start's step budgets and its place in the model cache (CPU, a micro build of a few seconds of CPU)."""

import json
import os
import random
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from experiments.needle import warm_start
from experiments.needle.needle import NEEDLE_RE, SUBJ
from experiments.needle.reader import build_tokenizer, reader_config
from experiments.needle.warm_start import RECIPE_VERSION, Scale, agent_config, cache, cached_warm_start, paper_rows
from recurrent.impls.memory import MemoryWorkflow
from recurrent.models import MANIFEST

# The four stages at a few steps of batch 4 on small pools: a random reader reaches no target here (0.9 exact or
# per-token accuracy), so every stage runs its whole budget.
REPO = Path(__file__).resolve().parents[3]
MICRO = Scale("replication-reader-test", steps=(3, 2, 2, 2), pools=(8, 8, 4), held=(8, 4, 4, 2), batch=4)


@pytest.fixture(scope="module")
def micro(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    lines = []
    folder = cached_warm_start(root, scale=MICRO, log=lines.append)
    return folder, lines


def weights(folder):
    return load_file(folder / "model.safetensors")


def test_train_stage_stops_at_its_step_budget_or_its_target():
    from transformers import AutoModelForCausalLM

    tokenizer = build_tokenizer()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(reader_config(tokenizer, hidden=32, layers=1, heads=2, kv_heads=1))
    rows = paper_rows(MemoryWorkflow(agent_config(), tokenizer), random.Random(0), 2)
    pad = tokenizer.pad_token_id

    def run(steps, stop_key, stop_at, every):
        return warm_start.train_stage(
            model, "t", lambda n: rows[:n], rows, pad, 1e-3, 1, steps, stop_key, stop_at, 2, every, log=lambda _: None
        )

    unreachable = run(5, "exact", 1.1, 2)  # scored at steps 2, 4 and the last, 5
    assert [r["step"] for r in unreachable["curve"]] == [2, 4, 5]
    assert (unreachable["steps"], unreachable["budget"], unreachable["stopped"]) == (5, 5, "budget")
    reached = run(5, "exact", 0.0, 2)  # any score reaches 0.0: stops at the first one
    assert [r["step"] for r in reached["curve"]] == [2]
    assert (reached["steps"], reached["budget"], reached["stopped"]) == (2, 5, "target")
    no_target = run(3, None, 0.9, 50)
    assert [r["step"] for r in no_target["curve"]] == [3] and no_target["stopped"] == "budget"


def test_the_record_names_the_threads_the_build_ran_on():
    """The numerics are read while the build's threads are set: a process on 2 threads building on 1 (the
    command without OMP_NUM_THREADS=1) recorded 2, though its weights were the 1-thread build's."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        *_, recipe = warm_start.train(MICRO, threads=1, log=lambda _: None)
        assert torch.get_num_threads() == 2  # restored after the build
    finally:
        torch.set_num_threads(before)
    assert recipe["threads"] == 1 and recipe["numerics"]["threads"] == 1


def test_the_cached_build_runs_the_budgets_and_has_a_manifest(micro):
    folder, lines = micro
    assert folder.name == "replication-reader-test"
    assert sorted(p.name for p in folder.parent.iterdir()) == ["replication-reader-test"]  # no temporary folders
    manifest = json.loads((folder / MANIFEST).read_text())
    built = manifest.pop("built")  # how it came out: every stage ran its budget here (no target is reachable)
    assert [(s["stage"], s["steps"], s["stopped"]) for s in built["stages"]] == [
        ("synth", 3, "budget"),
        ("needle", 2, "budget"),
        ("paper", 2, "budget"),
        ("naive", 2, "budget"),
    ]
    assert all(set(s) >= {"tok_acc", "exact", "loss"} for s in built["stages"]) and built["numerics"]["threads"] == 1
    assert manifest == {
        "name": "replication-reader-test",
        "recipe": RECIPE_VERSION,
        "seed": 0,
        "p_needle": 0.25,  # recipe 5: the needle task's teacher (P_NEEDLE)
        "p_keep": 0.9,
        "steps": [3, 2, 2, 2],
        "pools": [8, 8, 4],
        "held": [8, 4, 4, 2],
        "batch": 4,
        "answer": 0,  # MICRO has no answer stage (recipe 6's FULL has one)
    }
    recipe = json.loads((folder / "warm_start.json").read_text())
    stages = recipe["stages"]
    assert [s["stage"] for s in stages] == ["synth", "needle", "paper", "naive"]
    assert [s["steps"] for s in stages] == [3, 2, 2, 2]
    assert [s["budget"] for s in stages] == [3, 2, 2, 2]
    assert [s["stopped"] for s in stages] == ["budget"] * 4
    assert stages[0]["tokens"] == 3 * 4 * 64  # 3 steps of 4 synthetic rows, each 64 tokens long
    assert [s["tokens"] > 0 and s["wall_s"] >= s["train_s"] >= 0 for s in stages] == [True] * 4
    assert recipe["threads"] == 1
    # One progress line per evaluation point (the last step of each stage here), a header per stage.
    assert sum(line.startswith("stage ") for line in lines) == 4
    assert [line.split()[0] for line in lines if " step " in line] == ["synth", "needle", "paper", "naive"]
    assert set(weights(folder)) and (folder / "tokenizer.json").is_file()


def test_an_up_to_date_cache_is_reused_without_training(micro, monkeypatch):
    folder, _ = micro
    stamp = (folder / "model.safetensors").stat().st_mtime_ns

    def no_training(*args, **kwargs):
        raise AssertionError("the cached warm start was rebuilt")

    monkeypatch.setattr(cache, "train", no_training)  # the cache module builds
    lines = []
    assert cached_warm_start(folder.parent, scale=MICRO, log=lines.append) == folder
    assert (folder / "model.safetensors").stat().st_mtime_ns == stamp
    assert lines == ["replication-reader-test: up to date, reused"]


def test_a_stale_or_unmarked_folder_is_rebuilt(micro, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, _ = micro
    model, tokenizer = AutoModelForCausalLM.from_pretrained(folder), AutoTokenizer.from_pretrained(folder)
    trained = []

    recipe = json.loads((folder / "warm_start.json").read_text())

    def stub_train(*args, **kwargs):  # stands in for the training: the micro build's model and recipe, numbered
        trained.append(1)
        return model, tokenizer, recipe | {"stub": len(trained)}

    monkeypatch.setattr(cache, "train", stub_train)
    for n, change in enumerate(("recipe", "steps", "no manifest"), 1):
        root = tmp_path / change.replace(" ", "-")
        copy = root / MICRO.name
        shutil.copytree(folder, copy)
        manifest = json.loads((copy / MANIFEST).read_text())
        if change == "no manifest":  # a folder copied by hand, or an older build's without its manifest
            (copy / MANIFEST).unlink()
        else:
            manifest[change] = {"recipe": RECIPE_VERSION - 1, "steps": [3, 2, 2, 1]}[change]
            (copy / MANIFEST).write_text(json.dumps(manifest))
        assert cached_warm_start(root, scale=MICRO, log=lambda _: None) == copy
        assert len(trained) == n
        assert json.loads((copy / "warm_start.json").read_text())["stub"] == n
        assert (copy / MANIFEST).read_text() == (folder / MANIFEST).read_text()
        assert [p.name for p in root.iterdir()] == [MICRO.name]


class Killed(Exception):
    pass


def test_a_killed_build_leaves_nothing_and_the_next_call_rebuilds_the_same_weights(micro, tmp_path, monkeypatch):
    folder, _ = micro

    def kill_at_the_last_stage(line):
        if line.startswith("stage 4/4"):
            raise Killed

    with pytest.raises(Killed):  # killed while training
        cached_warm_start(tmp_path, scale=MICRO, log=kill_at_the_last_stage)
    assert list(tmp_path.iterdir()) == []

    from transformers import AutoModelForCausalLM, AutoTokenizer

    trained = AutoModelForCausalLM.from_pretrained(folder), AutoTokenizer.from_pretrained(folder), {}
    real_save = cache.save

    def save_then_die(*args):
        real_save(*args)  # the model, tokenizer and warm_start.json are written, the manifest is not
        raise Killed

    with monkeypatch.context() as patch:  # killed while writing the folder
        patch.setattr(cache, "train", lambda *a, **k: trained)
        patch.setattr(cache, "save", save_then_die)
        with pytest.raises(Killed):
            cached_warm_start(tmp_path, scale=MICRO, log=lambda _: None)
    assert list(tmp_path.iterdir()) == []

    rebuilt = cached_warm_start(tmp_path, scale=MICRO, log=lambda _: None)
    assert (rebuilt / MANIFEST).is_file()
    # Deterministic on one thread: the same weights and the same curves as the first build.
    first, second = weights(folder), weights(rebuilt)
    assert sorted(first) == sorted(second) and all(torch.equal(first[k], second[k]) for k in first)
    keys = ("step", "train_loss", "tok_acc", "exact", "loss")

    def curves(path):
        stages = json.loads((path / "warm_start.json").read_text())["stages"]
        return [[{k: r[k] for k in keys} for r in s["curve"]] for s in stages]

    assert curves(rebuilt) == curves(folder)


def test_cache_builds_the_recipe_as_it_is():
    refused = (
        ["--cache", "--steps", "1", "1", "1", "1"],
        ["--cache", "--seed", "1"],
        ["--cache", "--stop-at", "0.97"],
        ["--cache", "--answer-steps", "200"],
        ["--out", "x", "--answer-steps", "-1"],
        ["--cache", "--task", "choose", "--choice-steps", "1000"],
        ["--out", "x", "--choice-steps", "1000"],  # the needle task has no choice stage
        ["--out", "x", "--task", "choose", "--recipe", "recall", "--choice-steps", "1000"],
        ["--out", "x", "--task", "choose", "--choice-steps", "0"],
    )
    for argv in (*refused, ["--out", "x", "--cache"]):
        with pytest.raises(SystemExit):
            warm_start.main(argv)


def test_kept_copy_stages_are_reused_and_give_the_same_weights(micro, tmp_path):
    """A build that keeps its copy stages (copy_dir), and a teacher variant that reuses them, train the naive stage
    from the same model and the same random streams: the first equals the cached build weight for weight; the
    reuse trains only stage 4; a build with the same teacher from the kept stages equals the cached build again."""
    folder, _ = micro
    copy_dir = tmp_path / "copy"
    first_lines: list[str] = []
    first, _, recipe = warm_start.train(MICRO, log=first_lines.append, copy_dir=copy_dir)
    assert (copy_dir / warm_start.COPY_STAGES).is_file() and (copy_dir / "model.safetensors").is_file()
    assert sum(line.startswith("stage ") for line in first_lines) == 4
    cached = weights(folder)
    assert all(torch.equal(first.state_dict()[k], cached[k]) for k in cached)
    variant_lines: list[str] = []
    _, _, variant = warm_start.train(MICRO, p_keep=1.0, log=variant_lines.append, copy_dir=copy_dir)
    assert [line.split(":")[0] for line in variant_lines if line.startswith("stage")] == [
        "stages 1-3",
        "stage 4/4 naive",
    ]
    assert [s["stage"] for s in variant["stages"]] == ["synth", "needle", "paper", "naive"]
    assert variant["stages"][:3] == [s | {"reused_from": str(copy_dir)} for s in recipe["stages"][:3]]
    again, _, _ = warm_start.train(MICRO, log=lambda _: None, copy_dir=copy_dir)
    assert all(torch.equal(again.state_dict()[k], cached[k]) for k in cached)
    # another copy recipe (stop_at) does not reuse them: all four stages run, and the folder then holds the new ones
    other_lines: list[str] = []
    warm_start.train(MICRO, stop_at=0.5, log=other_lines.append, copy_dir=copy_dir)
    assert sum(line.startswith("stage ") for line in other_lines) == 4
    assert json.loads((copy_dir / warm_start.COPY_STAGES).read_text())["key"]["stop_at"] == 0.5


BUILD = """
import sys
from dataclasses import replace
from pathlib import Path
from experiments.needle.warm_start import Scale, cached_warm_start
scale = Scale("replication-reader-test", steps=(3, 2, 2, 2), pools=(8, 8, 4), held=(8, 4, 4, 2), batch=4)
cached_warm_start(Path(sys.argv[1]), scale=scale, log=lambda _: None)
"""


def test_two_builds_in_two_fresh_processes_give_the_same_weights_and_outcome(micro, tmp_path):
    """The build's command runs in a fresh process, where the numerics are pinned before the first kernel: two such
    builds (another hash seed each, tokenizers' threads on in one) give the same weights and manifest, and so does
    the build of this test process."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    envs = [env | {"PYTHONHASHSEED": "1"}, env | {"PYTHONHASHSEED": "2", "TOKENIZERS_PARALLELISM": "true"}]
    roots = [tmp_path / "a", tmp_path / "b"]
    runs = [
        subprocess.Popen([sys.executable, "-c", BUILD, str(root)], env=e, cwd=REPO)
        for root, e in zip(roots, envs, strict=True)
    ]
    assert [run.wait(timeout=600) for run in runs] == [0, 0]
    folders = [root / MICRO.name for root in roots]
    assert (folders[0] / "model.safetensors").read_bytes() == (folders[1] / "model.safetensors").read_bytes()
    manifests = [json.loads((folder / MANIFEST).read_text()) for folder in folders]
    assert manifests[0] == manifests[1]
    assert manifests[0]["built"]["numerics"]["mkl_cbwr"] == "AVX2"
    first, fresh = weights(micro[0]), weights(folders[0])
    # this process was pinned before its first kernel (tests/conftest.py): on an AVX-512 machine it would otherwise
    # compute on its own paths, and its build differ
    assert torch.backends.cpu.get_cpu_capability() == "AVX2"
    assert all(torch.equal(first[k], fresh[k]) for k in first)


def test_the_answer_rows_read_the_needle_in_memory_into_the_box():
    """An answer row is the final prompt (the question and the memory, no chunk) whose memory is one needle sentence
    and whose question asks for that needle's key, with the target ``\\boxed{its number}`` and eos, the number read
    back from the prompt's own text."""
    tokenizer = build_tokenizer()
    workflow = MemoryWorkflow(agent_config(), tokenizer)
    rows = warm_start.answer_rows(workflow, random.Random(0), 8)
    assert len(rows) == 8
    for prompt, target in rows:
        text = tokenizer.decode(prompt)
        needles = NEEDLE_RE.findall(text)
        assert len(needles) == 1, text  # the memory, and nothing of the document beside it
        (key, value) = needles[0]
        assert f"What is the special magic number for {key} mentioned in the provided text?" in text
        assert not any(subject in text for subject in SUBJ)  # no filler: a final prompt holds no chunk
        assert tokenizer.decode(target) == f"\\boxed{{{value}}}<|im_end|>"


def test_an_answer_stage_runs_after_the_copy_stages_when_the_scale_has_one():
    """``Scale.answer``: an answer stage of that budget between the copy stages and the naive one, its budget in the
    record's scale; a scale without one (the choosing task's recipes) has the four stages. The needle task's recipe
    (6) has one of 200 steps, its quick twin one of 2; the choosing task's recipes none."""
    *_, with_answer = warm_start.train(replace(MICRO, answer=2), log=lambda _: None)
    *_, without = warm_start.train(MICRO, log=lambda _: None)
    assert [s["stage"] for s in with_answer["stages"]] == ["synth", "needle", "paper", "answer", "naive"]
    assert with_answer["stages"][3]["steps"] == 2 and with_answer["scale"]["answer"] == 2
    assert [s["stage"] for s in without["stages"]] == ["synth", "needle", "paper", "naive"]
    assert (warm_start.FULL.answer, warm_start.QUICK.answer, RECIPE_VERSION) == (200, 2, 6)
    assert all(scale.answer == 0 for pair in warm_start.CHOOSE_RECIPES.values() for scale in pair)
