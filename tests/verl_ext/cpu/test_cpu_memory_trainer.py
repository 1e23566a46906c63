"""Our trainer end to end on CPU: ``scripts/train_tiny_cpu.sh`` (TASK=memory: ``python -m verl_ext.main
--config-name tiny_cpu``) for 2 steps, then resumed to 3 (issues 7, 10). Two launches serve every trainer check of
this module: a launch costs ~65 s on 2 idle cores (most of it start-up), a step ~5 s.

The first run: the memory agent (``recurrent_agent`` loop, ``RecurrentAgentLoopManager``, ``RecurrentPPOTrainer``) on a
needle-in-a-haystack task made on the fly (documents of 2-4 chunks), GRPO with n=4 and no std division, the KL
loss against the reference policy, two FSDP2 ranks, validation before training and after every step, a
checkpoint every step, console + JSONL metrics, rollout dumps with each row's advantage. Its one change from
``configs/tiny_cpu.yaml``: ``ppo_mini_batch_size=2``, so that the paper's count makes two updates per step (4
prompts / 2) and a trajectory could be cut across them. Checked:

- the actor's weights changed (the exported Hugging Face folder of each checkpoint, loaded with
  ``AutoModelForCausalLM``, against the initial tiny model);
- the paper's update count, counted by the optimizer itself (AdamW's ``step`` in the checkpointed state): two
  updates per step, each on two whole prompts with all rows of all their trajectories;
- the README's path from a checkpoint to the paper's table, its commands as written there: verl's model merger
  turns the last checkpoint's FSDP shards into the exported model rounded to bf16, tensor for tensor, with its
  tokenizer; the merged folder served (``transformers serve`` standing in for ``vllm serve``) and run through the
  evaluation harness gives ``table2.md``;
- from the rollout dump: every row of a trajectory (its memory turns and its final answer) carries one
  advantage, equal to GRPO computed here by hand from the dumped final-answer scores (score minus the mean of
  its prompt's group); memory turns are present; padding rows have no advantage;
- the logged metrics (reward of the final answers, KL, advantages) are finite and agree with the dumped rows;
- the rollout memory is released while the actor trains (``free_cache_engine=true``, the default): the rollout
  server's own event log (``hf_cpu``, the CPU twin of vLLM's server);
- a second invocation with STEPS=3 loads the step-2 checkpoint, trains only step 3, and step 3 takes the
  prompts an uninterrupted run takes (the data is read in file order: step k takes the k-th batch of rows).

The resumed run also switches on what the paper's defaults leave off, so that one launch checks them: lockstep
rollouts (``recurrent.mode=sync``, for validation and training), verl's row counting of mini-batches
(``recurrent.minibatch=rows``), the rollout kept in memory (``free_cache_engine=false``) and the credit ablation
(``recurrent.credit=final_same_step``: only the answer turns are trained). They act at different places (who
drives the rollout, how rows are cut into updates, what the server keeps, which rows carry loss), so one step
shows each. A resume may change such settings: they are read at start-up, not checkpointed. Timings are printed
(``pytest -s``).
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

import pytest
from omegaconf import OmegaConf
from readme_blocks import readme_commands
from trainer_run import (
    REPO,
    STAGES,
    adam_steps,
    grpo_by_hand,
    load_safetensors,
    read_jsonl,
    read_metrics,
    run_script,
    tail,
    trajectories,
)

RUN_TIMEOUT_S = 400  # each of the two runs; ~65 s and ~60 s on 2 idle cores
# The run's sizes, as configs/tiny_cpu.yaml sets them (prompts per step, trajectories per prompt, in validation).
_CONFIG = OmegaConf.load(REPO / "configs" / "tiny_cpu.yaml")
BATCH = _CONFIG.data.train_batch_size
N = _CONFIG.actor_rollout_ref.rollout.n
VAL_N = _CONFIG.actor_rollout_ref.rollout.val_kwargs.n
VAL_PROMPTS = 4  # scripts/train_tiny_cpu.sh makes 4 validation questions (TASK=memory: --val 4)
MINI_BATCH = _CONFIG.actor_rollout_ref.actor.ppo_mini_batch_size
SOURCE = "toy_memory"
# The first run: half the prompts of a step per mini-batch, so the paper's count makes two updates per step.
FIRST_MINI_BATCH = BATCH // 2
UPDATES = BATCH // FIRST_MINI_BATCH
# The resumed step 3: lockstep rollouts, verl's row counting, the rollout kept in memory, credit on the final
# answers only.
RESUMED_SWITCHES = (
    "recurrent.mode=sync",
    "recurrent.minibatch=rows",
    "actor_rollout_ref.rollout.free_cache_engine=false",
    "recurrent.credit=final_same_step",
)

pytestmark = [pytest.mark.trainer, pytest.mark.slow(seconds=300), pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("train_tiny_cpu_memory")
    (out_dir / "events_first").mkdir()
    first = run_script(
        out_dir,
        steps=2,
        task="memory",
        timeout_s=RUN_TIMEOUT_S,
        overrides=(f"actor_rollout_ref.actor.ppo_mini_batch_size={FIRST_MINI_BATCH}",),
        extra_env={"RECURRENT_ROLLOUT_EVENTS": str(out_dir / "events_first")},
    )
    assert first[0] == 0, tail(first[1])
    metrics_first = read_metrics(out_dir / "metrics.jsonl")
    (out_dir / "events").mkdir()
    second = run_script(
        out_dir,
        steps=3,
        task="memory",
        timeout_s=RUN_TIMEOUT_S,
        overrides=RESUMED_SWITCHES,
        extra_env={"RECURRENT_ROLLOUT_EVENTS": str(out_dir / "events")},
    )
    assert second[0] == 0, tail(second[1])
    return {"out": out_dir, "first": first, "second": second, "metrics_first": metrics_first}


def dumped(out: Path, step: int) -> list[dict]:
    return read_jsonl(out / "rollout" / f"{step}.jsonl")


def test_two_steps_with_validation_log_finite_metrics(runs):
    rc, output, elapsed = runs["first"]
    metrics = runs["metrics_first"]
    assert "[train_tiny_cpu] task=memory" in output
    assert re.search(r"\[recurrent\] step 1: reward=", output) and re.search(r"\[recurrent\] step 2: reward=", output)
    assert "[plot_training] reward per step:" in output and (runs["out"] / "training.png").is_file()
    assert sorted(metrics) == [0, 1, 2]  # validation before training (step 0), then steps 1 and 2
    for step in (0, 1, 2):  # validation scores each session's final answer: dense reward and strict verdict
        assert 0.0 <= metrics[step][f"val-aux/{SOURCE}/reward/mean@{VAL_N}"] <= 1.0
        assert 0.0 <= metrics[step][f"val-core/{SOURCE}/acc/mean@{VAL_N}"] <= 1.0
    for step in (1, 2):
        data = metrics[step]
        for key in (
            "actor/kl_loss",
            "actor/pg_loss",
            "actor/grad_norm",
            "critic/score/mean",
            "critic/advantages/mean",
            "critic/advantages/max",
            "critic/advantages/min",
            "recurrent/final/reward/mean",
            "recurrent/final/acc/mean",
            "recurrent/turns_per_sample/mean",
        ):
            assert key in data and math.isfinite(data[key]), (step, key, data.get(key))
        assert data["actor/kl_coef"] == pytest.approx(0.001)
        assert data["actor/kl_loss"] >= 0.0  # low_var_kl is non-negative
        assert data["actor/grad_norm"] > 0
        assert data["recurrent/num_trajectories"] == BATCH * N
        # the paper's count: train_batch_size / ppo_mini_batch_size updates, the actor's report agrees
        assert data["recurrent/minibatch/updates"] == data["recurrent/minibatch/updates_made"] == UPDATES
        for stage in STAGES:
            assert math.isfinite(data[f"timing_s/{stage}"]), stage
        # the HF server's log-probs agree with the FSDP actor's recompute: the weight sync works
        assert data["training/rollout_probs_diff_max"] < 0.05
    # step 2's actor was updated at step 1 while the reference policy stays the initial model: the KL term is live
    assert metrics[2]["actor/kl_loss"] > 0.0
    timings = {stage: [round(metrics[s][f"timing_s/{stage}"], 2) for s in (1, 2)] for stage in STAGES}
    print(f"\n[memory trainer] 2 steps: wall {elapsed:.0f} s; timing_s per step (step 1, step 2): {timings}")


def test_every_turn_of_a_trajectory_gets_its_grpo_advantage(runs):
    out, metrics = runs["out"], runs["metrics_first"]
    nonzero = 0
    for step in (1, 2):
        rows = dumped(out, step)
        assert len({row["uid"] for row in rows}) == len(rows)  # verl's `uid` column: the row key
        assert all(row["step"] == step for row in rows)
        by_trajectory = trajectories(rows)
        assert len(by_trajectory) == BATCH * N
        assert len({t.rsplit("_", 1)[0] for t in by_trajectory}) == BATCH  # n trajectories per prompt
        real = [row for rows_ in by_trajectory.values() for row in rows_]
        assert len(real) > len(by_trajectory)  # memory turns are rows of their own
        for turns in by_trajectory.values():
            # documents of 2-4 chunks: 2-4 memory turns, then the final answer
            assert [row["turn_index"] for row in turns] == list(range(len(turns))) and 3 <= len(turns) <= 5
            assert [row["turn_kind"] for row in turns] == ["memory"] * (len(turns) - 1) + ["final"]
            assert {row["score"] for row in turns} == {turns[-1]["score"]}  # the final reward on every turn
        expected = grpo_by_hand(by_trajectory)
        for trajectory, turns in by_trajectory.items():
            for row in turns:
                assert row["advantage_spread"] == 0.0, row["uid"]  # one scalar on all of a row's tokens
                assert row["advantage"] == pytest.approx(expected[trajectory], abs=1e-6), (step, row["uid"])
                assert row["response_length"] > 0
        for row in rows:
            if row["is_padding"]:  # verl's zero-mask padding rows: nothing to train on
                assert row["response_length"] == 0 and row["advantage"] == 0.0
        nonzero += sum(abs(value) > 0 for value in expected.values())

        # the logged statistics are the dumped rows'
        data = metrics[step]
        advantages = [row["advantage"] for row in real]
        lengths = [row["response_length"] for row in real]
        finals = [turns[-1]["score"] for turns in by_trajectory.values()]
        assert data["critic/advantages/max"] == pytest.approx(max(advantages), abs=1e-6)
        assert data["critic/advantages/min"] == pytest.approx(min(advantages), abs=1e-6)
        token_mean = sum(a * n for a, n in zip(advantages, lengths, strict=True)) / sum(lengths)
        assert data["critic/advantages/mean"] == pytest.approx(token_mean, abs=1e-5)
        assert data["recurrent/final/reward/mean"] == pytest.approx(sum(finals) / len(finals), abs=1e-6)
        assert data["critic/score/mean"] == pytest.approx(sum(row["score"] for row in real) / len(real), abs=1e-6)
        assert data["recurrent/turns_per_sample/mean"] == pytest.approx(len(real) / len(by_trajectory))
        assert data["recurrent/calls/memory/length/mean"] == pytest.approx(
            sum(row["response_length"] for row in real if row["turn_kind"] == "memory")
            / sum(row["turn_kind"] == "memory" for row in real)
        )
    # the dense reward differs within GRPO groups: the update is not empty
    assert nonzero > 0


def test_the_papers_update_count_counted_by_the_optimizer(runs):
    out, metrics = runs["out"], runs["metrics_first"]
    ckpt = out / "checkpoints"
    # AdamW's own step counter: 2 updates per training step (4 prompts / 2 per mini-batch), whatever the rows.
    assert adam_steps(ckpt / "global_step_1" / "actor") == {UPDATES}
    assert adam_steps(ckpt / "global_step_2" / "actor") == {2 * UPDATES}
    for step in (1, 2):
        rows = dumped(out, step)
        by_trajectory = trajectories(rows)
        update_of = {}
        for name, turns in by_trajectory.items():
            assert len({row["minibatch"] for row in turns}) == 1, name  # all rows of a trajectory: one update
            update_of[name] = turns[0]["minibatch"]
        assert sorted(set(update_of.values())) == list(range(UPDATES))
        for update in range(UPDATES):  # each update: whole prompts with all their trajectories (mini-batch x n)
            members = [name for name, u in update_of.items() if u == update]
            assert len(members) == FIRST_MINI_BATCH * N
            assert len({name.rsplit("_", 1)[0] for name in members}) == FIRST_MINI_BATCH
        # rows per update (padding included) is what the worker was told, and the dump has every row
        assert len(rows) == UPDATES * metrics[step]["recurrent/minibatch/rows"]


def test_rollout_memory_is_released_while_the_actor_trains(runs):
    # free_cache_engine=true (the default): after every rollout verl sleeps the replicas and the server holds no
    # weights until verl's worker resumes it for the weight sync; then generation starts again.
    logs = [read_jsonl(path) for path in sorted((runs["out"] / "events_first").glob("*.jsonl"))]
    assert logs, "no rollout server wrote events"
    for events in logs:
        names = [e["event"] for e in events]
        # at start-up and after each training rollout (a validation and the next step's rollout share a wake-up)
        assert names.count("sleep") >= 3
        for i, name in enumerate(names):
            if name == "sleep":
                assert events[i]["held_parameter_bytes"] == 0
                assert names[i + 1 : i + 4] == ["wake_up:weights", "update_weights", "wake_up:kv_cache"]
            if name == "generate":
                assert events[i]["held_parameter_bytes"] > 0
                if i + 1 < len(names):
                    assert names[i + 1] == "sleep"  # nothing else happens to the server before it sleeps


def test_weights_changed_and_the_checkpoint_loads_as_a_hugging_face_model(runs, tiny_model_dir):
    import torch
    from transformers import AutoModelForCausalLM

    ckpt = runs["out"] / "checkpoints"
    for step in (1, 2, 3):
        actor = ckpt / f"global_step_{step}" / "actor"
        for rank in (0, 1):  # two FSDP ranks
            assert (actor / f"model_world_size_2_rank_{rank}.pt").is_file()
            assert (actor / f"optim_world_size_2_rank_{rank}.pt").is_file()
        assert (ckpt / f"global_step_{step}" / "data.pt").is_file()  # dataloader state, for resume
    # (AdamW's own count of updates: test_the_papers_update_count_counted_by_the_optimizer)

    def weights(folder: Path) -> dict:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}

    initial = weights(Path(tiny_model_dir))
    exported = {step: weights(ckpt / f"global_step_{step}" / "actor" / "huggingface") for step in (1, 2)}
    assert set(exported[2]) == set(initial)
    changed = [name for name in initial if not torch.equal(initial[name], exported[2][name])]
    assert len(changed) >= len(initial) // 2, changed  # optimizer steps touch (almost) every tensor
    assert any(not torch.equal(exported[1][name], exported[2][name]) for name in initial)  # step 2 moved them again


# ------------------------------------------------------------------------------------------------------------
# the README's "From a training checkpoint to the paper's table": its commands, as written there

README_SECTION = "## From a training checkpoint to the paper's table"


def option(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


@pytest.fixture(scope="module")
def merged(runs, tmp_path_factory):
    """The README's merge command run on the last checkpoint of the trainer run, in a user's environment; the
    section's other commands with its variables set the same way."""
    variables, commands = readme_commands(README_SECTION)
    assert set(variables) == {"CKPT", "MODEL"} and len(commands) == 3, (variables, commands)
    ckpt = runs["out"] / "checkpoints"
    step = (ckpt / "latest_checkpointed_iteration.txt").read_text().strip()
    values = {"CKPT": str(ckpt / f"global_step_{step}"), "MODEL": str(tmp_path_factory.mktemp("models") / "agent")}

    def substitute(argv: list[str]) -> list[str]:
        return [re.sub(r"\$([A-Z_]+)", lambda m: values[m.group(1)], arg) for arg in argv]

    merge, serve, evaluate = (substitute(argv) for argv in commands)
    assert merge[:4] == ["python", "-m", "verl.model_merger", "merge"], merge
    env = {k: v for k, v in os.environ.items() if k not in ("VERL_PLATFORM", "VERL_USE_EXTERNAL_MODULES")}
    result = subprocess.run(
        [sys.executable, *merge[1:]], capture_output=True, text=True, timeout=300, cwd=REPO, env=env
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return {"step": Path(values["CKPT"]), "model": Path(values["MODEL"]), "serve": serve, "evaluate": evaluate}


def test_verls_model_merger_gives_the_exported_model_in_bf16_with_its_tokenizer(merged, tiny_model_dir):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    exported_dir = merged["step"] / "actor" / "huggingface"  # save_contents has hf_model (configs/cpu_platform.yaml)
    model_dir = merged["model"]
    exported = load_safetensors(exported_dir / "model.safetensors")
    from_merger = load_safetensors(model_dir / "model.safetensors")
    assert set(from_merger) == set(exported)
    # Exact, after one rounding: the FSDP shards and the export hold the fp32 training weights (model_dtype fp32),
    # and the merger casts every shard to bf16 before joining them (verl/model_merger/fsdp_model_merger.py).
    for name, tensor in exported.items():
        assert tensor.dtype == torch.float32 and from_merger[name].dtype == torch.bfloat16, name
        assert torch.equal(from_merger[name], tensor.to(torch.bfloat16)), name
    initial = load_safetensors(Path(tiny_model_dir) / "model.safetensors")
    assert any(not torch.equal(from_merger[n], initial[n].to(torch.bfloat16)) for n in initial)  # trained weights

    # The folder is a model transformers loads (the config of the checkpoint), computing what the export computes
    # in bf16, with the tokenizer and chat template the run trained with.
    config, exported_config = (json.loads((d / "config.json").read_text()) for d in (model_dir, exported_dir))
    for key in ("architectures", "hidden_size", "num_hidden_layers", "vocab_size", "tie_word_embeddings"):
        assert config[key] == exported_config[key], key
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    reference = AutoModelForCausalLM.from_pretrained(exported_dir, dtype=torch.bfloat16)
    assert model.dtype == torch.bfloat16
    tokenizer, original = AutoTokenizer.from_pretrained(model_dir), AutoTokenizer.from_pretrained(tiny_model_dir)
    text = "What is the secret code of the harbor? The code is 8019."
    ids = tokenizer(text, return_tensors="pt").input_ids
    assert ids.tolist() == original(text, return_tensors="pt").input_ids.tolist()
    with torch.no_grad():
        assert torch.equal(model(ids).logits, reference(ids).logits)
    messages = [{"role": "user", "content": text}]
    assert tokenizer.apply_chat_template(messages, tokenize=False) == original.apply_chat_template(
        messages, tokenize=False
    )


def test_the_merged_model_served_and_evaluated_gives_table_2(merged, tmp_path):
    from recurrent.local_server import transformers_serve
    from taskutils.memory_eval import config as cfg
    from taskutils.memory_eval.model_servers import vllm_command
    from taskutils.memory_eval.run import main as run_main

    model, serve, evaluate = str(merged["model"]), merged["serve"], merged["evaluate"]
    # serve: vLLM cannot run here; the README's flags are ones the harness's own `vllm serve` command line uses
    assert serve[:3] == ["vllm", "serve", model]
    harness_flags = {a for a in vllm_command(model, "name", 8000, tp=2, replicas=4) if a.startswith("--")}
    assert {a for a in serve if a.startswith("--")} <= harness_flags
    # evaluate: the merged folder, through the served name, over the paper's grid of RULER-HotpotQA
    assert evaluate[:3] == ["python", "-m", "taskutils.memory_eval.run"]
    assert option(evaluate, "--models") == model and option(evaluate, "--tasks") == cfg.HOTPOTQA
    assert option(evaluate, "--served-model") == option(serve, "--served-model-name")
    paper_grid = (*cfg.HOTPOTQA_DOCS, *cfg.HOTPOTQA_DOCS_OVER_1M)
    assert option(evaluate, "--lengths") == ",".join(str(n) for n in paper_grid)

    # The same command against the merged folder behind `transformers serve`, on eval sets of 2 and 4 documents
    # (one question each) instead of the paper's.
    data, results = tmp_path / "data", tmp_path / "results"
    data.mkdir()
    for docs in (2, 4):
        context = "\n\n".join(f"Document {i + 1}:\nThe harbor keeps lantern number {i}." for i in range(docs))
        item = {"index": 0, "input": "What number does the harbor keep?", "context": context, "answers": ["0"]}
        (data / f"eval_{docs}.jsonl").write_text(json.dumps(item) + "\n")
    with transformers_serve(model) as server:
        argv = evaluate[3:]
        argv[argv.index("--url") + 1] = server.base_url
        argv[argv.index("--served-model") + 1] = server.model
        argv[argv.index("--lengths") + 1] = "2,4"
        assert run_main([*argv, "--data-dir", str(data), "--results-dir", str(results), "--quiet"]) == 0
    name = merged["model"].name  # the folder name names the results
    for docs in (2, 4):
        lines = read_jsonl(results / f"hotpotqa_{docs}" / f"{name}__memory.jsonl")  # the paper's protocol
        assert len(lines) == 1 and lines[0]["error"] is None and lines[0]["turns"] == 2  # one chunk, then the answer
    table = [line for line in (results / "table2.md").read_text().splitlines() if line.startswith("|")]
    assert table[:2] == ["| Model | 2 docs | 4 docs |", "|---|---|---|"] and len(table) == 3
    cells = table[2].strip("|").split("|")
    assert cells[0].strip() == name and all(float(cell) in (0.0, 100.0) for cell in cells[1:])  # one item each


def test_resume_starts_at_step_3_with_the_same_data_order(runs):
    import pandas as pd

    out = runs["out"]
    rc, output, elapsed = runs["second"]
    assert "Loaded model from" in output and "global_step_2" in output, tail(output)
    steps = [int(s) for s in re.findall(r"\[recurrent\] step (\d+):", output)]
    assert steps == [3], steps  # only step 3 trains
    metrics = read_metrics(out / "metrics.jsonl")
    assert sorted(metrics) == [2, 3]  # validation at the resumed step, then step 3
    assert "timing_s/step" in metrics[3] and "timing_s/step" not in metrics[2]
    assert math.isfinite(metrics[3]["actor/kl_loss"]) and math.isfinite(metrics[3]["recurrent/final/reward/mean"])
    assert read_metrics(out / "metrics.1.jsonl").keys() == {0, 1, 2}  # the first run's file is kept
    assert (out / "checkpoints" / "latest_checkpointed_iteration.txt").read_text().strip() == "3"
    assert (out / "checkpoints" / "global_step_3" / "actor" / "huggingface" / "model.safetensors").is_file()

    # Data order: prompts are read in file order (data.shuffle=false), so an uninterrupted run trains step k on
    # the k-th batch of rows; the resumed step 3 must take the third (a fresh dataloader would restart at row 0).
    train = pd.read_parquet(out / "data" / "train.parquet")
    for step in (1, 2, 3):
        expected = {
            (train.prompt[i][0]["content"], train.reward_model[i]["ground_truth"])
            for i in range((step - 1) * BATCH, step * BATCH)
        }
        got = set()
        for turns in trajectories(dumped(out, step)).values():
            question = re.search(r"<problem> \n(.*)\n</problem>", turns[-1]["input"]).group(1)
            got.add((question, turns[-1]["gts"]))
        assert got == expected, (step, got, expected)
    total = runs["first"][2] + elapsed
    print(f"\n[memory trainer] resume to step 3: wall {elapsed:.0f} s; both runs {total:.0f} s")


# ------------------------------------------------------------------------------------------------------------
# the resumed step 3: the switches (RESUMED_SWITCHES)


def test_lockstep_rollouts_validate_and_train_the_resumed_step(runs):
    rc, output, elapsed = runs["second"]
    # lockstep: the whole batch in rounds of one turn per live trajectory: validation (4 prompts x 2), step 3
    # (4 prompts x 4), validation; as many rounds as the longest trajectory has turns
    lockstep = [
        tuple(map(int, m))
        for m in re.findall(r"\[recurrent\] lockstep: (\d+) trajectories in (\d+) rounds, (\d+) failed", output)
    ]
    longest = max(len(turns) for turns in trajectories(dumped(runs["out"], 3)).values())
    assert len(lockstep) == 3, lockstep  # validation at the resumed step, step 3, validation after it
    validations, step_3 = (lockstep[0], lockstep[2]), lockstep[1]
    for trajectories_, rounds, failed in validations:
        assert (trajectories_, failed) == (VAL_PROMPTS * VAL_N, 0) and 3 <= rounds <= 5
    assert step_3 == (BATCH * N, longest, 0)
    metrics = read_metrics(runs["out"] / "metrics.jsonl")
    assert 0.0 <= metrics[2][f"val-core/{SOURCE}/acc/mean@{VAL_N}"] <= 1.0
    assert metrics[3]["recurrent/rollout/failed_groups"] == 0 and metrics[3]["actor/grad_norm"] > 0


def test_verls_row_counting_is_a_switch(runs):
    out = runs["out"]
    rows = dumped(out, 3)  # padding rows included: verl pads to whole mini-batches
    per_update = MINI_BATCH * N  # verl's ppo_mini_batch_size x n rows per update
    assert len(rows) % per_update == 0
    updates = len(rows) // per_update
    # 3-5 rows per trajectory: verl makes several times the paper's one update per step
    assert updates >= 3
    # AdamW's own count: the paper's two updates at each of steps 1 and 2, then step 3's
    assert adam_steps(out / "checkpoints" / "global_step_3" / "actor") == {2 * UPDATES + updates}
    assert all(row["minibatch"] is None for row in rows)


def test_final_answer_credit_trains_only_the_answers(runs):
    out = runs["out"]
    by_trajectory = trajectories(dumped(out, 3))
    assert len(by_trajectory) == BATCH * N
    groups: dict[str, list[float]] = defaultdict(list)
    for name, turns in by_trajectory.items():
        groups[name.rsplit("_", 1)[0]].append(turns[-1]["score"])
    memory_rows = 0
    for name, turns in by_trajectory.items():
        *memory, final = turns
        memory_rows += len(memory)
        # memory turns: no tokens trained on, no advantage; the answer: GRPO by hand (score - its group's mean)
        assert all(row["response_length"] == 0 and row["advantage"] == 0.0 for row in memory), name
        scores = groups[name.rsplit("_", 1)[0]]
        assert final["response_length"] > 0
        assert final["advantage"] == pytest.approx(final["score"] - sum(scores) / len(scores), abs=1e-6)
    metrics = read_metrics(out / "metrics.jsonl")
    assert metrics[3]["recurrent/credit/earlier_rows_masked"] == memory_rows > 0


def test_a_kept_rollout_holds_its_weights_throughout(runs):
    # free_cache_engine=false: verl's sleep is a no-op and its worker never resumes: the weights stay throughout.
    # (With the default, true, the server is emptied after every rollout: the first run, tested above.)
    folder = runs["out"] / "events"
    kept_events = [read_jsonl(path) for path in sorted(folder.glob("*.jsonl"))]
    assert kept_events, "no rollout server wrote events"
    for events in kept_events:
        names = {e["event"] for e in events}
        assert "generate" in names and "sleep:kept" in names
        assert not any(name.startswith("wake_up") for name in names)
        assert "sleep" not in names and all(e["held_parameter_bytes"] > 0 for e in events)
