"""scripts/replicate_cpu.sh checks every environment value it reads before any work: a bad one stops it with one
line naming the variable and its value, exit status 2, and nothing written (not even OUT_DIR). Each case below
would otherwise have cost minutes or ended late: SEEDS=a built the data and launched a trainer before failing,
STEPS=-1 counted RL as done and the evaluation then failed on global_step_-1, LENGTHS=0 ended in a traceback, a
WARM_START folder without a tokenizer in a traceback after the data stage's start."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "scripts" / "replicate_cpu.sh"

pytestmark = pytest.mark.timeout(60)

TOKENIZER_FILES = "tokenizer.json, tokenizer_config.json, tokenizer.model, vocab.json"
CASES = {  # the environment, the line (each written out by hand)
    "SEEDS=a": ({"SEEDS": "a"}, "SEEDS=a: a is not a whole number (an RL seed)"),
    "SEEDS twice": ({"SEEDS": "0 0"}, "SEEDS='0 0': 0 twice"),
    "SEEDS blank": ({"SEEDS": " "}, "SEEDS=' ': empty; at least one is needed: a whole number (an RL seed)"),
    "ABLATION_SEEDS": ({"ABLATION_SEEDS": "0 x"}, "ABLATION_SEEDS='0 x': x is not a whole number (an RL seed)"),
    "STEPS=-1": ({"STEPS": "-1"}, "STEPS=-1: a whole number >= 1"),
    "STEPS=0": ({"STEPS": "0"}, "STEPS=0: a whole number >= 1"),
    "STEPS too long": ({"STEPS": "1" * 10}, f"STEPS={'1' * 10}: a whole number >= 1"),
    "STEPS leading zero": ({"STEPS": "08"}, "STEPS=08: a whole number >= 1"),
    "SEEDS leading zero": ({"SEEDS": "0 01"}, "SEEDS='0 01': 01 is not a whole number (an RL seed)"),
    "ABLATION_STEPS": ({"ABLATION_STEPS": "2.5"}, "ABLATION_STEPS=2.5: a whole number >= 1"),
    "LENGTHS=0": ({"LENGTHS": "0"}, "LENGTHS=0: 0 is not a whole number >= 1 (an evaluation length in chunks)"),
    "LENGTHS word": (
        {"LENGTHS": "1 2 x"},
        "LENGTHS='1 2 x': x is not a whole number >= 1 (an evaluation length in chunks)",
    ),
    "LENGTHS twice": ({"LENGTHS": "4 2 4"}, "LENGTHS='4 2 4': 4 twice"),
    "EVAL_DOCS": ({"EVAL_DOCS": "0"}, "EVAL_DOCS=0: a whole number >= 1"),
    "LONG_DOCS": ({"LONG_DOCS": "-3"}, "LONG_DOCS=-3: a whole number >= 1"),
    "NGPUS": ({"NGPUS": "two"}, "NGPUS=two: a whole number >= 1"),
    "RL_PARALLEL": ({"RL_PARALLEL": "0"}, "RL_PARALLEL=0: a whole number >= 1"),
    "PARALLEL_MODELS": ({"PARALLEL_MODELS": "0"}, "PARALLEL_MODELS=0: a whole number >= 1"),
    "QUICK": ({"QUICK": "yes"}, "QUICK=yes: 0 (the full run) or 1 (toy size)"),
    "ABLATIONS": (
        {"ABLATIONS": "final_same_step final"},
        "ABLATIONS='final_same_step final': final is not a credit variant (final_same_step, final_token_mean)",
    ),
    "ABLATIONS twice": (
        {"ABLATIONS": "final_token_mean final_token_mean"},
        "ABLATIONS='final_token_mean final_token_mean': final_token_mean twice",
    ),
    "LATE_START": ({"LATE_START": "1.5"}, "LATE_START=1.5: a share of the training documents, a number in [0, 1]"),
    "DECOY_START": ({"DECOY_START": "half"}, "DECOY_START=half: a share of the training documents, a number in [0, 1]"),
    "shares over 1": (
        {"LATE_START": "0.6", "DECOY_START": ".5"},
        "LATE_START=0.6 + DECOY_START=.5: more than 1 (shares of the same training documents)",
    ),
    "PYTHON": ({"PYTHON": "/no/such/python"}, "PYTHON=/no/such/python: no interpreter there (make setup builds the"),
    "PYTHON without the packages": (
        {"PYTHON": "/usr/bin/false"},
        "PYTHON=/usr/bin/false: cannot import the repository's packages with it (verl_ext.settings)",
    ),
    "DISTRACTORS": ({"DISTRACTORS": "-1"}, "DISTRACTORS=-1: a whole number >= 0"),
    "DISTRACTORS of the choosing task": (
        {"TASK": "choose", "DISTRACTORS": "03"},
        "DISTRACTORS=03: the choosing task needs a whole number >= 1",
    ),
}


def run_script(env: dict[str, str], cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(SCRIPT)], env={**os.environ, **env}, cwd=cwd, capture_output=True, text=True, timeout=50
    )


def refused(done: subprocess.CompletedProcess) -> str:
    """The one line of a refusal: exit status 2, nothing else printed."""
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_bad_value_is_one_line_before_any_work(tmp_path, case):
    env, line = CASES[case]
    run = tmp_path / "run"
    # A value that got past its check must not start the pipeline: WARM_START names no folder, checked after
    # every value, so that the script would stop there (with another line) instead.
    said = refused(run_script({"QUICK": "1", **env, "OUT_DIR": str(run), "WARM_START": str(tmp_path / "guard")}))
    assert said == line or (case == "PYTHON" and said.startswith(line)), said
    assert not run.exists()


def test_an_out_dir_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "run").write_text("")
    env = {"QUICK": "1", "OUT_DIR": str(tmp_path / "run"), "WARM_START": str(tmp_path / "guard")}
    assert refused(run_script(env)) == (f"OUT_DIR={tmp_path / 'run'}: a file, not a folder")


def copy_model(tiny_model_dir: str, folder: Path, keep) -> Path:
    folder.mkdir()
    for entry in Path(tiny_model_dir).iterdir():
        if keep(entry.name):
            (folder / entry.name).write_bytes(entry.read_bytes())
    return folder


WARM_STARTS = {  # what the folder keeps of the tiny model's files, what the line says it lacks
    "no tokenizer": (lambda name: not name.startswith("tokenizer"), f"no tokenizer ({TOKENIZER_FILES})"),
    "no weights": (lambda name: name != "model.safetensors", "no weights (*.safetensors or pytorch_model*.bin)"),
    "no config": (lambda name: name != "config.json", "no config.json"),
    "empty": (
        lambda name: False,
        f"no config.json; no weights (*.safetensors or pytorch_model*.bin); no tokenizer ({TOKENIZER_FILES})",
    ),
}


@pytest.mark.parametrize("case", sorted(WARM_STARTS))
def test_a_warm_start_folder_without_a_models_files_is_named_before_any_work(tiny_model_dir, tmp_path, case):
    keep, lacks = WARM_STARTS[case]
    warm = copy_model(tiny_model_dir, tmp_path / "warm", keep)
    run = tmp_path / "run"
    # relative, as a caller would type it: read from the caller's directory
    said = refused(run_script({"QUICK": "1", "OUT_DIR": str(run), "WARM_START": "warm"}, cwd=tmp_path))
    assert said == f"WARM_START={warm}: {lacks}"
    assert not run.exists()


def test_a_missing_warm_start_folder_is_named(tmp_path):
    said = refused(run_script({"QUICK": "1", "OUT_DIR": str(tmp_path / "run"), "WARM_START": str(tmp_path / "x")}))
    assert said == f"WARM_START={tmp_path / 'x'}: no such folder"
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("run", "env", "variable"),
    [
        ("rl-seed0", {"STEPS": "7"}, "STEPS"),
        (
            "ablation-same-step-seed0",
            {"ABLATIONS": "final_same_step", "ABLATION_SEEDS": "0", "ABLATION_STEPS": "3"},
            "ABLATION_STEPS",
        ),
    ],
)
def test_a_run_past_the_steps_asked_without_their_checkpoint_is_refused(tiny_model_dir, tmp_path, run, env, variable):
    """A run folder that trained 30 steps, checkpoints every 5 (kept: 25 and 30), asked for fewer: RL counted it done
    and the evaluation then failed on the missing global_step_N, after every other stage."""
    out = tmp_path / "run"
    checkpoints = out / "runs" / run / "checkpoints"
    for step in (25, 30):
        (checkpoints / f"global_step_{step}" / "actor" / "huggingface").mkdir(parents=True)
    (checkpoints / "latest_checkpointed_iteration.txt").write_text("30")
    (out / "data").write_text("")  # were it not refused, the data stage would fail at once (no minutes of work)
    asked = env[variable]
    said = refused(run_script({"QUICK": "1", "SEEDS": "0", **env, "OUT_DIR": str(out), "WARM_START": tiny_model_dir}))
    assert said == (
        f"{variable}={asked}: runs/{run} in OUT_DIR trained 30 steps and kept no checkpoint of step {asked} to "
        f"evaluate ({variable}=30 evaluates its last one)"
    )
    assert not (out / "run.jsonl").exists() and not (out / "timing.jsonl").exists()
    # a step it kept is evaluated as it is: the same command goes past the check (to the data stage, which fails)
    env[variable] = "25"
    done = run_script({"QUICK": "1", "SEEDS": "0", **env, "OUT_DIR": str(out), "WARM_START": tiny_model_dir})
    assert "kept no checkpoint" not in done.stderr and "2/6 data" in done.stdout
