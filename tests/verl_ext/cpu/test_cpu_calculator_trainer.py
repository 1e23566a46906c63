"""The second agent trained through verl on CPU: the calculator (``experiments/calculator/agent.py``, an agent
written as a plain async function) by ``CONFIG=calculator_cpu scripts/train_tiny_cpu.sh`` for 2 steps, from the
quick warm start of ``experiments/calculator/warm_start.py`` (a short SFT on teacher transcripts: sampled, it
writes tool calls, so trajectories have 1-3 model calls). One launch serves every check of this module.

Its step shape: 4 problems x n 4 trajectories, ``ppo_mini_batch_size`` 2, so the paper's count makes two optimizer
updates per step and a trajectory could be cut across them; no checkpoints; validation (greedy) after the last
step. Checked:

- the memory agent's module (``recurrent.impls.memory``) enters ``sys.modules`` in no process of the run: every
  Python process of it loads a ``sitecustomize`` (first on its ``PYTHONPATH``) that puts a finder at the head of
  ``sys.meta_path``, which every import of a module not yet in ``sys.modules`` asks first (an ``import``
  statement and ``importlib.import_module`` alike, as the agent registry imports agents), and which writes the
  agents' and experiments' modules it is asked for to the process's stderr; that reaches the launcher's output
  (the trainer's own, and Ray's workers' through Ray's log forwarding). Each process also says that it watches,
  so the processes are counted, and the calculator's module is there, in the trainer and in a worker: the log
  does show the processes that ran the agent;
- from verl's rollout dump, at the engine: one row per model call (the calls a trajectory made are its tool calls
  plus the answer), each call's prompt the conversation so far, rendered by the chat template (the first call's
  prompt is the system prompt and the question, as built here by hand), each tool result only in the next call's
  prompt and in no response (never trained on), the trajectory's one GRPO advantage (computed here from the final
  rows' scores, no std division) on every row, and all rows of a trajectory in one optimizer update, each update
  holding whole problems with all their trajectories;
- the logged per-trajectory metrics agree with the dump.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pandas as pd
import pytest
from omegaconf import OmegaConf
from trainer_run import REPO, grpo_by_hand, read_jsonl, read_metrics, run_script, tail, trajectories

from experiments.calculator.agent import parse_tool_call
from experiments.calculator.tool import calculate

BUILD_TIMEOUT_S = 1200  # the quick warm start: ~55 s of one core, once (then cached with the offline models)
RUN_TIMEOUT_S = 900  # the fixture: ~170 s on 2 idle cores beside another trainer run, quick build included
BATCH, N, MINI_BATCH = 4, 4, 2  # problems per step, trajectories per problem, problems per optimizer update
UPDATES = BATCH // MINI_BATCH
STEPS = 2
OVERRIDES = (
    f"data.train_batch_size={BATCH}",
    f"actor_rollout_ref.rollout.n={N}",
    f"actor_rollout_ref.actor.ppo_mini_batch_size={MINI_BATCH}",
    "trainer.val_before_train=False",
    f"trainer.test_freq={STEPS}",
    "trainer.save_freq=-1",
)
AGENT = OmegaConf.load(REPO / "configs" / "calculator_cpu.yaml").recurrent.config
MEMORY_MODULE = "recurrent.impls.memory"
CALCULATOR_MODULE = "experiments.calculator.agent"

pytestmark = [pytest.mark.trainer, pytest.mark.slow(seconds=200), pytest.mark.timeout(2400)]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("train_tiny_cpu_calculator")
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    build = subprocess.run(
        [sys.executable, "-m", "experiments.calculator.warm_start", "--cache", "--quick"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
    )
    assert build.returncode == 0, build.stdout[-2000:] + build.stderr[-2000:]
    model = Path(build.stdout.strip().splitlines()[-1])
    data = root / "data"
    subprocess.run(
        [sys.executable, "-m", "experiments.calculator.task", "--out", str(data), "--train", "16", "--validation", "8"]
        + ["--test", "0"],
        cwd=REPO,
        env=env,
        check=True,
        capture_output=True,
        timeout=120,
    )
    out = root / "run"
    watch = root / "import_watch"
    watch.mkdir()
    (watch / "sitecustomize.py").write_text(IMPORT_WATCH)
    extra = {
        "CONFIG": "calculator_cpu",
        "DATA_DIR": str(data),
        "MODEL": str(model),
        "PYTHONPATH": f"{watch}{os.pathsep}{REPO}",
    }
    rc, output, elapsed = run_script(out, STEPS, "config", RUN_TIMEOUT_S, OVERRIDES, extra)
    assert rc == 0, tail("\n".join(line for line in output.splitlines() if "[import-watch]" not in line))
    print(f"\n[calculator trainer] {STEPS} steps: wall {elapsed:.0f} s")
    return {"out": out, "output": output, "model": model, "data": data}


# ------------------------------------------------------------------------------------------------------------
# which modules each process imported

# Written as sitecustomize.py into a folder first on the run's PYTHONPATH: each Python process of the run loads it at
# start-up. The finder answers nothing (the usual finders load the module); it only reports what it is asked for.
IMPORT_WATCH = """
import os
import sys

WATCHED = ("recurrent.impls.", "experiments.")


class ImportWatch:
    def find_spec(self, name, path=None, target=None):
        if name.startswith(WATCHED):
            print(f"[import-watch] pid={os.getpid()} imports {name}", file=sys.stderr, flush=True)
        return None


sys.meta_path.insert(0, ImportWatch())
print(f"[import-watch] pid={os.getpid()} watching", file=sys.stderr, flush=True)
"""
# A line of it in the launcher's output, with Ray's "(WorkerDict pid=123) " prefix (colours included) where a worker
# wrote it.
_WATCH_LINE = re.compile(
    r"^(?:\x1b\[\d+m)?(?:\((?P<who>[^)]*)\)(?:\x1b\[0m)? )?\[import-watch\] pid=(?P<pid>\d+) "
    r"(?:imports (?P<module>\S+)|watching)$"
)


def imports_by_process(output: str) -> dict[int, tuple[str, set[str]]]:
    """Per process id: who printed it (the launcher's own lines "", Ray's forwarded lines their prefix) and the
    watched modules it imported."""
    processes: dict[int, tuple[str, set[str]]] = {}
    for line in output.splitlines():
        match = _WATCH_LINE.match(line)
        if match:
            who, modules = processes.setdefault(int(match.group("pid")), (match.group("who") or "", set()))
            if match.group("module"):
                modules.add(match.group("module"))
    return processes


def watched_run(code: str, tmp_path: Path) -> str:
    """The stderr of ``python -c code`` under the import watch."""
    (tmp_path / "sitecustomize.py").write_text(IMPORT_WATCH)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}"}
    probe = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert probe.returncode == 0, probe.stderr[-2000:]
    return probe.stderr


@pytest.mark.parametrize(
    "code",
    [
        f"import {MEMORY_MODULE}",
        "from recurrent.interface import load_register; load_register('memory')",  # importlib.import_module
    ],
)
def test_the_import_watch_sees_the_memory_agent_where_it_is_imported(code, tmp_path):
    # The check below is only as good as the watch: a process that imports the memory agent, by an import
    # statement or through the registry, shows it, in its own output and as Ray forwards a worker's.
    stderr = watched_run(code, tmp_path)
    forwarded = "\n".join(f"\x1b[36m(WorkerDict pid=1)\x1b[0m {line}" for line in stderr.splitlines())
    for log in (stderr, forwarded):
        (who, modules), *others = imports_by_process(log).values()
        assert MEMORY_MODULE in modules and others == []


def test_no_process_of_the_run_imports_the_memory_agent(run):
    processes = imports_by_process(run["output"])
    # Ray forwards its workers' lines under a prefix ("(raylet)" for what a worker prints as it starts, then
    # "(WorkerDict pid=...)"); the launcher's own processes (the trainer, the supervisor, the script's tools) have none.
    workers = [pid for pid, (who, _) in processes.items() if who]
    # the trainer and its Ray workers (FSDP ranks, rollout servers, agent-loop and reward workers) all watched
    assert len(processes) - len(workers) >= 1 and len(workers) >= 6, processes
    for who, modules in processes.values():
        assert not {name for name in modules if name == MEMORY_MODULE or name.startswith("experiments.needle")}, who
    # the agent was built where its calls were made: in the trainer (the preflight) and in a Ray worker
    assert any(CALCULATOR_MODULE in modules for pid, (who, modules) in processes.items() if pid not in workers)
    assert any(CALCULATOR_MODULE in processes[pid][1] for pid in workers)


# ------------------------------------------------------------------------------------------------------------
# the rows at the engine


def dumped(run: dict, step: int) -> list[dict]:
    return read_jsonl(run["out"] / "rollout" / f"{step}.jsonl")


def tool_response(expression: str) -> str:
    """What the agent sends back for a call's expression ('' for a malformed call)."""
    result = calculate(expression) if expression else "error: malformed tool call"
    return f"<tool_response>{result[: AGENT.max_result_chars]}</tool_response>"


def first_prompt_text(tokenizer, question: str) -> str:
    """The first call's prompt as the dump shows it: the system prompt and the question in the chat template
    with the generation prompt, decoded without special tokens."""
    messages = [{"role": "system", "content": AGENT.system_prompt}, {"role": "user", "content": question}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    return tokenizer.decode(ids, skip_special_tokens=True)


def test_one_row_per_model_call_and_tool_results_only_in_prompts(run):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(run["model"])
    # the first call's prompt of every training problem, built here, with the problem's answer
    train = pd.read_parquet(run["data"] / "train.parquet")
    first_prompts = {
        first_prompt_text(tokenizer, prompt[0]["content"]): reward["ground_truth"]
        for prompt, reward in zip(train["prompt"], train["reward_model"], strict=True)
    }
    calls_seen = defaultdict(int)
    for step in range(1, STEPS + 1):
        by_trajectory = trajectories(dumped(run, step))
        assert len(by_trajectory) == BATCH * N
        for name, rows in by_trajectory.items():
            calls = len(rows)
            calls_seen[calls] += 1
            assert [row["turn_index"] for row in rows] == list(range(calls)) and 1 <= calls <= AGENT.max_turns
            assert [row["turn_kind"] for row in rows] == ["call"] * (calls - 1) + ["final"], name
            expressions = [parse_tool_call(row["output"]) for row in rows]
            # the agent called again after each tool call, and only then: tool calls + the answer = its rows
            assert all(expression is not None for expression in expressions[:-1]), name
            assert expressions[-1] is None or calls == AGENT.max_turns, name
            assert first_prompts.get(rows[0]["input"]) == rows[0]["gts"], name
            for row, expression, following in zip(rows[:-1], expressions[:-1], rows[1:], strict=True):
                # the next call's prompt: this one, the reply as the assistant's turn, the tool's result as a user
                # turn, the generation prompt (the template's special tokens are not in the decoded text)
                result = tool_response(expression)
                assert following["input"] == f"{row['input']}{row['output']}\nuser\n{result}\nassistant\n", name
            for row in rows:  # a response is what the model generated: never a tool's result
                assert (
                    "<tool_response>" not in row["output"] and 0 < row["response_length"] <= AGENT.max_tokens_per_turn
                )
    # the quick warm start calls the tool: both kinds of trajectory are here
    assert calls_seen[1] > 0 and sum(count for calls, count in calls_seen.items() if calls > 1) > 0, dict(calls_seen)
    print(f"\n[calculator trainer] trajectories by model calls: {dict(sorted(calls_seen.items()))}")


def test_the_dump_holds_each_rows_token_ids_and_the_rows_tool_prints_them(run, capsys):
    """The CPU platform dumps every row's ids as trained (recurrent.dump_token_ids): the first call's prompt ids
    are the chat template's ids of the system prompt and question, and verl's text columns are their decoding."""
    from transformers import AutoTokenizer

    from verl_ext.rows import main as rows_main

    tokenizer = AutoTokenizer.from_pretrained(run["model"])
    rows = [row for row in dumped(run, 1) if not row["is_padding"]]
    for row in rows:
        assert tokenizer.decode(row["prompt_ids"], skip_special_tokens=True) == row["input"]
        assert tokenizer.decode(row["response_ids"], skip_special_tokens=True) == row["output"]
        assert len(row["response_ids"]) == row["response_length"]
    templates = {}  # the first call's prompt ids of every training problem, by their text as verl dumps it
    for prompt in pd.read_parquet(run["data"] / "train.parquet")["prompt"]:
        messages = [
            {"role": "system", "content": AGENT.system_prompt},
            {"role": "user", "content": prompt[0]["content"]},
        ]
        ids = list(
            tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
        )
        templates[tokenizer.decode(ids, skip_special_tokens=True)] = ids
    first = next(row for row in rows if row["turn_index"] == 0)
    assert first["prompt_ids"] == templates[first["input"]]
    assert rows_main([str(run["out"] / "rollout"), "--step", "1", "--json"]) == 0
    shown = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert sorted(r["uid"] for r in shown) == sorted(row["uid"] for row in rows)


def test_every_row_of_a_trajectory_carries_its_grpo_advantage(run):
    nonzero = 0
    for step in range(1, STEPS + 1):
        by_trajectory = trajectories(dumped(run, step))
        expected = grpo_by_hand(by_trajectory)
        for name, rows in by_trajectory.items():
            assert {row["score"] for row in rows} == {rows[-1]["score"]}  # the answer's reward on every row
            for row in rows:
                assert row["advantage_spread"] == 0.0, row["uid"]  # one scalar on all of a row's tokens
                assert row["advantage"] == pytest.approx(expected[name], abs=1e-6), (step, row["uid"])
        nonzero += sum(abs(value) > 0 for value in expected.values())
    print(f"\n[calculator trainer] trajectories with a non-zero advantage: {nonzero} of {STEPS * BATCH * N}")


def test_a_trajectory_is_trained_whole_within_one_update(run):
    for step in range(1, STEPS + 1):
        by_trajectory = trajectories(dumped(run, step))
        update_of = {}
        for name, rows in by_trajectory.items():
            assert len({row["minibatch"] for row in rows}) == 1, name
            update_of[name] = rows[0]["minibatch"]
        assert sorted(set(update_of.values())) == list(range(UPDATES))
        for update in range(UPDATES):  # whole problems with all their trajectories
            members = [name for name, u in update_of.items() if u == update]
            assert len(members) == MINI_BATCH * N
            assert len({name.rsplit("_", 1)[0] for name in members}) == MINI_BATCH


def test_the_logged_metrics_are_the_dumped_rows(run):
    metrics = read_metrics(run["out"] / "metrics.jsonl")
    assert {1, 2} <= set(metrics)
    for step in range(1, STEPS + 1):
        data = metrics[step]
        by_trajectory = trajectories(dumped(run, step))
        real = [row for rows in by_trajectory.values() for row in rows]
        finals = [rows[-1]["score"] for rows in by_trajectory.values()]
        assert data["recurrent/num_trajectories"] == BATCH * N
        assert data["recurrent/turns_per_sample/mean"] == pytest.approx(len(real) / len(by_trajectory))
        assert data["recurrent/final/reward/mean"] == pytest.approx(sum(finals) / len(finals), abs=1e-6)
        assert data["recurrent/minibatch/updates"] == data["recurrent/minibatch/updates_made"] == UPDATES
        for key in ("actor/kl_loss", "actor/pg_loss", "actor/grad_norm"):
            assert math.isfinite(data[key]), (step, key)
    # greedy validation of the 8 held-out problems after the last step
    assert 0.0 <= metrics[STEPS]["val-core/calculator_arithmetic/acc/mean@1"] <= 1.0
    print(json.dumps({s: metrics[s].get("recurrent/final/reward/mean") for s in range(1, STEPS + 1)}))
