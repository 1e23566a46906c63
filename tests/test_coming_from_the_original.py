"""The README's "Coming from the original" table, row by row: every path it names here exists, and every command it
names here answers `--help` where the original's users type it (the working folder the row says)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
SECTION = "## Coming from the original"


def table_rows() -> list[tuple[str, str]]:
    text = (REPO / "README.md").read_text().split(SECTION, 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 2 and cells[0] not in ("the original", "---"):
            rows.append((cells[0], cells[1]))
    return rows


def our_paths(cell: str) -> list[str]:
    """The repository paths a cell names (a file or folder of ours, by its extension or trailing slash; not a URL, a
    pattern, a variable or a folder that a run makes)."""
    return [
        code
        for code in re.findall(r"`([^`]+)`", cell)
        if " " not in code
        and ("/" in code or code.endswith((".py", ".sh")))
        and not code.startswith(("-", "data/", "results/", "memory_agent/"))  # folders that runs make
        and not any(mark in code for mark in ("://", "$", "{"))
    ]


def our_commands(cell: str) -> list[tuple[Path, list[str]]]:
    """The commands a cell names, as (working folder, argv up to the subcommand): `cd DIR && python FILE [STAGE]`,
    `python -m MODULE [STAGE]`, `bash FILE`."""
    commands = []
    for code in re.findall(r"`([^`]+)`", cell):
        folder = REPO
        if code.startswith("cd ") and " && " in code:
            where, code = code[3:].split(" && ", 1)
            folder = REPO / where
        argv = shlex.split(code)
        env = [a for a in argv if re.fullmatch(r"[A-Z_]+=\S*", a)]
        argv = argv[len(env) :]
        if argv[:1] == ["python"]:
            words = argv[1:3] if argv[1] == "-m" else argv[1:2]
            stage = [a for a in argv[1 + len(words) :][:1] if re.fullmatch(r"[a-z][a-z-]*", a)]
            commands.append((folder, [sys.executable, *words, *stage]))
        elif argv[:2] == ["hf", "download"]:  # the hub's own client, installed with our dependencies
            commands.append((folder, [str(Path(sys.executable).parent / "hf"), "download"]))
        elif argv[:1] == ["bash"] and argv[1].endswith(".sh"):
            commands.append((folder, ["bash", argv[1]]))
    return commands


def test_the_table_lists_every_path_of_the_original_readme():
    # The original's README names these paths and commands (its Testing, Training, Data and Engineering sections).
    original = " ".join(cell for cell, _ in table_rows())
    for named in (
        "taskutils/memory_data",
        "download_qa_dataset.sh",
        "hfd.sh",
        "processing.py",
        "filter.py",
        "filter2.py",
        "convert_to_eval.py",
        "different_docs_eval.py",
        "download_paulgraham_essay.py",
        "ruler_data_prepare.sh",
        "taskutils/memory_eval && python run.py",
        "SERVE_PORT",
        "run_memory_7B.sh",
        "run_memory_14B.sh",
        "recurrent/impls/memory.py",
        "recurrent/interface.py",
        "recurrent/generation_manager.py",
        "recurrent/impls/async_",
        "recurrent/async_generation_manager.py",
        "verl/workers/reward_manager/thread.py",
    ):
        assert named in original, named


@pytest.mark.parametrize(("original", "ours"), table_rows(), ids=[row[0][:40] for row in table_rows()])
def test_each_row_points_at_something_that_is_here(original, ours):
    paths, commands = our_paths(ours), our_commands(ours)
    assert paths or commands, ours
    for path in paths:
        assert (REPO / path.rstrip("/")).exists(), path
    for folder, argv in commands:
        if argv[0] == "bash":  # a training launcher: its DRY_RUN is tested with the launcher; here, that it is ours
            assert (folder / argv[1]).is_file(), argv
            continue
        env = {**os.environ, "PYTHONPATH": ""}  # as a user's shell: nothing of the test run's path
        result = subprocess.run([*argv, "--help"], cwd=folder, capture_output=True, text=True, env=env, timeout=300)
        assert result.returncode == 0, (folder, argv, result.stderr[-2000:])
        assert "usage:" in result.stdout.lower(), result.stdout[:500]


# -- The original's commands, typed as its README says, row by row -------------------------------------------------


def run(argv: list[str], folder: Path = REPO, **env: str) -> subprocess.CompletedProcess:
    """A command as a user's shell runs it: in ``folder``, none of the original's variables set but ``env``."""
    shell = {k: v for k, v in os.environ.items() if k not in ORIGINAL_VARIABLES and k != "PYTHONPATH"}
    shell |= {"OMP_NUM_THREADS": "1", **env}
    return subprocess.run(argv, cwd=folder, env=shell, capture_output=True, text=True, timeout=300)


ORIGINAL_VARIABLES = ("DATAROOT", "DATASET_ROOT", "MEMAGENT_DATA_DIR", "SERVE_PORT", "SERVE_HOST", "DASH_PORT")
ORIGINAL_VARIABLES += ("MODELROOT", "RECURRENT_CHUNK_SIZE", "RECURRENT_MAX_NEW", "RECURRENT_MAX_CONTEXT_LEN")
ORIGINAL_VARIABLES += ("MAX_INPUT_LEN", "MAX_OUTPUT_LEN", "URL", "MODE", "DRY_RUN")
MEMORY_DATA, MEMORY_EVAL = REPO / "taskutils" / "memory_data", REPO / "taskutils" / "memory_eval"


def harness(*argv: str, **env: str) -> subprocess.CompletedProcess:
    return run([sys.executable, "run.py", *argv], MEMORY_EVAL, **env)


def launcher_command(tmp_path: Path, *overrides: str, **env: str) -> tuple[subprocess.CompletedProcess, str]:
    """``DRY_RUN=1 bash run_memory_7B.sh OVERRIDES`` from ``tmp_path``: the run and its printed command line."""
    env = {"DRY_RUN": "1", "PYTHON": sys.executable, "PROJ_ROOT": str(tmp_path / "runs"), **env}
    done = run(["bash", str(REPO / "run_memory_7B.sh"), *overrides], tmp_path, **env)
    command = next((line for line in done.stdout.splitlines() if line.startswith("[memagent] command:")), "")
    return done, command


def check_one_data_folder(tmp_path):
    # The stages write where the harness and the launchers read, from the original's working folders.
    released = tmp_path / "hotpotqa"  # the original: hfd.sh ... then export DATAROOT=$(pwd)/hotpotqa
    ruler = ["run.py", "ruler", "--tasks", "niah_single_1", "--lengths", "512", "--num-samples", "2"]
    made = run([sys.executable, *ruler, "--tokenizer", "tiny"], MEMORY_DATA, DATAROOT=str(released))
    assert made.returncode == 0, made.stderr[-2000:]
    assert (released / "eval_niah_single_1_512.jsonl").is_file()
    # The harness finds it from its own folder (a closed port: the items fail, the set was found and planned).
    results = tmp_path / "results"
    closed = "http://127.0.0.1:9/v1"
    argv = ["--models", "tiny", "--tasks", "niah_single_1", "--lengths", "512", "--url", closed, "--max-retries", "0"]
    found = harness(*argv, "--results-dir", str(results), "--no-report", DATAROOT=str(released))
    assert "no eval set" not in found.stderr, found.stderr[-2000:]
    meta = json.loads(next(results.glob("niah_single_1_512/*.meta.json")).read_text())
    assert str(released / "eval_niah_single_1_512.jsonl") in json.dumps(meta)
    # Without the variable the harness looks in the repository's data folder, and says how to choose another.
    missing = harness("--models", "tiny", "--tasks", "niah_single_1", "--lengths", "7", "--url", closed)
    assert missing.returncode == 2
    assert f"looked for {REPO / 'data' / 'hotpotqa'}/eval_niah_single_1_7.jsonl" in missing.stderr
    assert "--data-dir DIR, or $MEMAGENT_DATA_DIR or the original's $DATAROOT" in missing.stderr
    # DATASET_ROOT (the original launchers' variable) names the same folder's parent, for every command.
    for folder in (REPO, MEMORY_DATA, MEMORY_EVAL):
        printed = run([sys.executable, "-m", "taskutils.data_root"], folder, DATASET_ROOT=str(tmp_path))
        assert printed.stdout.strip() == f"{released} ($DATASET_ROOT/hotpotqa)"
        printed = run([sys.executable, "-m", "taskutils.data_root"], folder)
        assert printed.stdout.strip() == f"{REPO / 'data' / 'hotpotqa'} (the default)"


def check_the_launchers_read_what_the_stages_write(tmp_path):
    folder = tmp_path / "hotpotqa"
    folder.mkdir()
    _, command = launcher_command(tmp_path, DATAROOT=str(folder))
    assert f"data.train_files={folder}/hotpotqa_train_32k.parquet " in command
    assert f"data.val_files={folder}/hotpotqa_dev.parquet " in command
    (folder / "hotpotqa_train.parquet").write_bytes(b"")  # the original filter2.py's name, alone
    _, command = launcher_command(tmp_path, DATASET_ROOT=str(tmp_path))
    assert f"data.train_files={folder}/hotpotqa_train.parquet " in command
    # The filter stage's own output name is the launchers' (taskutils/memory_data/stages.py).
    from taskutils.memory_data.stages import filtered_file

    assert (filtered_file("train"), filtered_file("dev")) == ("hotpotqa_train_32k.parquet", "hotpotqa_dev.parquet")


def check_launcher_variables(tmp_path):
    for script, size in (("run_memory_7B.sh", "7B"), ("run_memory_14B.sh", "14B")):
        env = {"DRY_RUN": "1", "PYTHON": sys.executable, "PROJ_ROOT": "runs", "DATASET_ROOT": "released"}
        done = run(["bash", str(REPO / script)], tmp_path, **env)  # relative: read from the launching folder
        assert done.returncode == 0, done.stderr[-2000:]
        assert f"trainer.default_local_dir={tmp_path}/runs/memory_agent/{size} " in done.stdout
        assert f"data.train_files={tmp_path}/released/hotpotqa/hotpotqa_train_32k.parquet " in done.stdout


def check_serve_port(tmp_path):
    done = harness(SERVE_PORT="8000", DASH_PORT="8265")
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("python -m taskutils.memory_eval.run: error: SERVE_PORT=8000 is the original's")
    assert "--url http://HOST:PORT/v1" in line
    done = harness(DASH_PORT="8265")
    assert done.returncode == 2 and "DASH_PORT=8265" in done.stderr and "--replicas" in done.stderr
    # The row's replacement parses as typed.
    from taskutils.memory_eval.arguments import parse_args

    assert parse_args(["--url", "http://localhost:8000/v1"]).url == "http://localhost:8000/v1"


def check_modelroot(tmp_path):
    done = harness(MODELROOT=str(tmp_path))
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
    assert "MODELROOT=" in done.stderr and "--models PATH" in done.stderr and "YaRN" in done.stderr


def check_budget_variables(tmp_path):
    for name, field in (("RECURRENT_CHUNK_SIZE", "chunk_size"), ("RECURRENT_MAX_NEW", "max_new")):
        done = harness(**{name: "5000"})
        assert done.returncode == 2 and f"{name}=5000" in done.stderr and f"({field})" in done.stderr
    done = harness(MAX_INPUT_LEN="120000")
    assert done.returncode == 2 and "direct: max_input" in done.stderr


def check_methods(tmp_path):
    for old, new in (("recurrent", "memory"), ("openai", "direct"), ("recurrent-boxed", "memory-boxed")):
        done = harness("--method", old)
        assert done.returncode == 2 and f"pass --method {new}" in done.stderr, done.stderr[-500:]
    from taskutils.memory_eval.arguments import parse_args

    assert parse_args(["--method", "memory,direct-boxed"]).method == ["memory", "direct-boxed"]


def check_model_names(tmp_path):
    done = harness("--models", "R1-14B-120k+10k-openai")
    assert done.returncode == 2 and "pass --models R1-14B-120k+10k" in done.stderr
    from taskutils.memory_eval import config as cfg

    names = {entry.name for entry in cfg.load_table(None)}
    # The original's run.py CONFIGS names, each in the table here but the one renamed.
    original = ["MemoryAgent-7B-5k-1k-infty", "MemoryAgent-14B-5k-1k-infty", "L1-120k+10k", "Qwen-14B-990k+10k"]
    original += ["Qwen-7B-990k+10k", "R1-32B-120k+10k", "R1-7B-120k+10k", "Qwen-32B-120k+10k", "Qwen-14B-120k+10k"]
    original += ["Qwen-7B-120k+10k", "Qwen-32B-5k-1k-infty", "Qwen-14B-5k-1k-infty", "Qwen-7B-5k-1k-infty"]
    assert set(original) <= names and "R1-14B-120k+10k" in names


def check_visualize_reads_the_converted_results(tmp_path):
    # Two models' HotpotQA results at 50 documents (one item failed) and a RULER file, in our layout.
    ours = tmp_path / "results"
    rows = {
        "hotpotqa_50/MemoryAgent-14B-5k-1k-infty__memory.jsonl": [(1, 1, 1.0), (0.5, 0, 0.67), None],
        "hotpotqa_50/R1-7B-120k+10k__direct.jsonl": [(0, 0, 0.0), (1, 1, 1.0), (1, 1, 1.0)],
        "niah_single_1_8192/MemoryAgent-14B-5k-1k-infty__memory.jsonl": [(1, None, None), (0, None, None)],
    }
    for name, items in rows.items():
        path = ours / name
        path.parent.mkdir(parents=True, exist_ok=True)
        lines = []
        for k, scores in enumerate(items):
            line = {"id": k, "question": f"q{k}", "gold": [f"a{k}"], "response": "r", "pred": "p", "error": None}
            if scores is None:
                line |= {"error": "ChatRequestError: refused", "sub_em": 0, "em": 0, "f1": 0, "response": None}
            else:
                line |= dict(zip(("sub_em", "em", "f1"), scores, strict=True))
            lines.append(json.dumps(line))
        path.write_text("\n".join(lines) + "\n")
    out = tmp_path / "original" / "results"
    done = run([sys.executable, "-m", "taskutils.memory_eval.to_original", str(ours), str(out)])
    assert done.returncode == 0, done.stderr[-2000:]
    # What the original's visualize.py computes: results/ruler_hqa*/*.jsonl, the mean of judge_sub_em x 100, per
    # folder and file stem.
    table = {}
    for path in sorted(out.glob("ruler_hqa*/*.jsonl")):
        values = [json.loads(line)["judge_sub_em"] for line in path.read_text().splitlines()]
        table[(path.parent.name, path.stem)] = round(sum(values) / len(values) * 100, 2)
    assert table == {
        ("ruler_hqa_50", "MemoryAgent-14B-5k-1k-infty"): 50.0,  # (1 + 0.5 + 0, the failed item) / 3
        ("ruler_hqa_50", "R1-7B-120k+10k"): 66.67,
    }
    ruler_file = out / "ruler_niah_single_1_8192" / "MemoryAgent-14B-5k-1k-infty.jsonl"
    ruler = [json.loads(line) for line in ruler_file.read_text().splitlines()]
    assert [(r["index"], r["judge_sub_em"], "judge_em" in r) for r in ruler] == [(0, 1, False), (1, 0, False)]
    failed = json.loads((out / "ruler_hqa_50" / "MemoryAgent-14B-5k-1k-infty.jsonl").read_text().splitlines()[2])
    assert failed["judge_sub_em"] == 0 and failed["error"].startswith("ChatRequestError")


def check_async_folder(tmp_path):
    done, command = launcher_command(tmp_path, MODE="async")
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"trainer.default_local_dir={tmp_path}/runs/memory_agent/7B_async " in command
    assert "trainer.experiment_name=memory_agent/7B_async" in command and "recurrent.mode=async" in command
    _, command = launcher_command(tmp_path)
    assert f"trainer.default_local_dir={tmp_path}/runs/memory_agent/7B " in command


def check_hydra_keys(tmp_path):
    # The original's keys as its run_memory_7B.sh typed them (the + of its own key included).
    original = ["recurrent.enable=memory", "recurrent.memory.config.chunk_size=4000", "+data.context_key='context'"]
    original += ["algorithm.grpo_use_adv=True", "actor_rollout_ref.rollout.mode=async"]
    done, _ = launcher_command(tmp_path, *original)
    assert done.returncode == 0, done.stderr[-3000:]
    config = yaml.safe_load(done.stdout.split("composed config follows; not starting\n", 1)[1])
    assert config["recurrent"]["config"]["chunk_size"] == 4000
    assert config["recurrent"]["agent"] == "memory" and config["recurrent"]["mode"] == "async"
    assert config["algorithm"]["norm_adv_by_std_in_grpo"] is True
    assert "data" not in config or "context_key" not in config["data"]
    assert (
        "recurrent.memory.config.chunk_size=4000 is the original's key: read as recurrent.config.chunk_size=4000"
        in (done.stderr)
    )


def check_refused_hydra_keys(tmp_path):
    for override, names in (
        ("reward_model.reward_manager='thread'", "reward.custom_reward_function"),
        ("actor_rollout_ref.rollout.chat_scheduler=recurrent.async_utils.ChatCompletionProxy", "recurrent.mode=async"),
        ("data.truncation='center'", "recurrent.config.max_chunks"),
    ):
        done, _ = launcher_command(tmp_path, override)
        assert done.returncode == 2, (override, done.stderr[-2000:])
        assert done.stderr.strip().splitlines()[-1].startswith(f"[memagent] {override}: the original's key")
        assert names in done.stderr


def check_quickstart(tmp_path):
    import importlib.util

    from aiohttp import web
    from threaded_http import serve_in_a_thread

    spec = importlib.util.spec_from_file_location("quickstart_of_the_row", REPO / "quickstart.py")
    quickstart = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(quickstart)
    assert quickstart.build_parser().parse_args(["--model", "M", "--max_new", "1024"]).max_new == 1024
    assert quickstart.ORIGINAL_URL == "http://localhost:8000/v1"
    # `vllm serve M` then `python quickstart.py --model M`: the server at the default URL that serves M is used.
    app = web.Application()
    app.router.add_get("/v1/models", lambda request: web.json_response({"data": [{"id": "M", "object": "model"}]}))
    with serve_in_a_thread(app, 30) as url:
        assert quickstart.original_default_url("M", url) == url
        assert quickstart.original_default_url("other", url) is None
    assert quickstart.original_default_url("M", "http://127.0.0.1:9/v1") is None  # nothing there: a local server
    # An empty URL= is unset, and a model that is nowhere gets both ways to serve it.
    done = run([sys.executable, "quickstart.py", "--model", "no-such-org/no-such-model"], URL="")
    assert done.returncode == 2 and "set URL (and API_KEY)" in done.stderr and "vllm serve no-such-org" in done.stderr


# The first code span of a row's "the original" cell -> its check. Rows whose original cell names only paths are
# checked by test_each_row_points_at_something_that_is_here.
ORIGINAL_COMMANDS = {
    "export DATAROOT=$(pwd)/hotpotqa": check_one_data_folder,
    "hotpotqa_train.parquet": check_the_launchers_read_what_the_stages_write,
    "run_memory_7B.sh": check_launcher_variables,
    "SERVE_PORT=8000 DASH_PORT=8265 python run.py": check_serve_port,
    "MODELROOT": check_modelroot,
    "RECURRENT_CHUNK_SIZE": check_budget_variables,
    "--api recurrent": check_methods,
    "R1-14B-120k+10k-openai": check_model_names,
    "results/ruler_hqa_{N}/{name}.jsonl": check_visualize_reads_the_converted_results,
    "run_memory_7B_async.sh": check_async_folder,
    "recurrent.memory.config.chunk_size=5000": check_hydra_keys,
    "reward_model.reward_manager=thread": check_refused_hydra_keys,
    "vllm serve M": check_quickstart,
}


def first_code(cell: str) -> str:
    return re.findall(r"`([^`]+)`", cell)[0]


def names_a_setting(code: str) -> bool:
    """An environment variable, a Hydra key set, or a flag: what a renamed command's --help does not check."""
    return bool(re.search(r"\b[A-Z][A-Z_]{3,}\b", code) or re.search(r"\w\.\w+=", code) or code.startswith("--"))


def test_every_row_of_a_variable_a_key_or_a_flag_has_its_check():
    for original, _ in table_rows():
        if any(names_a_setting(code) for code in re.findall(r"`([^`]+)`", original)):
            assert first_code(original) in ORIGINAL_COMMANDS, original
    assert set(ORIGINAL_COMMANDS) <= {first_code(original) for original, _ in table_rows()}


@pytest.mark.parametrize("row", list(ORIGINAL_COMMANDS))
def test_the_original_command_of_the_row(row, tmp_path):
    ORIGINAL_COMMANDS[row](tmp_path)
