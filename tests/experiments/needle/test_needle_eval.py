"""The replication's needle task and readers in the evaluation harness: the task is planned, found and scored; the
reader table carries the replication's budgets; the harness's prompts are the training prompts token for token;
the direct baseline fits the reader's window; and (slow) a reader served by a real `transformers serve` with
continuous batching answers as an in-process greedy `generate` does."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
import yaml
from scripted_turns import run_scripted

from experiments.needle import eval_models
from experiments.needle.needle import make_document
from experiments.needle.reader import build_tokenizer, reader_config
from experiments.needle.warm_start import agent_config
from recurrent.impls.memory import MemoryWorkflow
from recurrent.interface import Reply
from taskutils.memory_eval import config as cfg
from taskutils.memory_eval import evalsets, report, scoring
from taskutils.memory_eval.agents import make_workflow
from taskutils.memory_eval.arguments import parse_args
from taskutils.memory_eval.planning import check_data
from taskutils.memory_eval.run import main as run_main

NEEDLE = "The special magic number for odd-tiger is 4711."
QUESTION = "What is the special magic number for odd-tiger mentioned in the provided text?"


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def write_set(folder: Path, chunks: int, items: list[dict]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"eval_needle_{chunks}.jsonl"
    path.write_text("".join(json.dumps(item) + "\n" for item in items))
    return path


def test_needle_is_planned_by_chunk_count_and_not_part_of_all():
    entry = cfg.ModelEntry(name="r", checkpoint="r")
    assert cfg.expand_tasks(["needle"]) == ["needle"]
    assert "needle" not in cfg.expand_tasks(None) and "needle" not in cfg.expand_tasks(["all"])
    assert cfg.plan(entry, ["needle"], None) == [("needle", n) for n in (1, 2, 4, 8, 16, 32, 64)]
    assert cfg.plan(entry, ["needle"], [1, 64]) == [("needle", 1), ("needle", 64)]
    assert report.context_tokens("needle", 8) == 512  # 8 chunks of 64 tokens on the plot's axis


def test_needle_files_are_found_checked_and_missing_lengths_named(tmp_path):
    items = [
        {"index": 0, "input": QUESTION, "context": f"A dog ran. {NEEDLE}", "answers": ["4711"]},
        {"index": 1, "input": QUESTION, "context": f"{NEEDLE} The end.", "answers": ["4711"]},
    ]
    path = write_set(tmp_path, 2, items)
    assert evalsets.data_file(tmp_path, "needle", 2) == path
    assert evalsets.data_file(tmp_path, "needle", 4) is None
    assert evalsets.scan(path) == [0, 1]
    args = parse_args(["--tasks", "needle", "--lengths", "2", "--data-dir", str(tmp_path)])
    assert check_data([cfg.ModelEntry(name="r", checkpoint="r")], args) == []
    args = parse_args(["--tasks", "needle", "--lengths", "2,4", "--data-dir", str(tmp_path)])
    with pytest.raises(evalsets.EvalDataError, match=r"length\(s\) 4: looked for .*eval_needle_4.jsonl"):
        check_data([cfg.ModelEntry(name="r", checkpoint="r")], args)


@pytest.mark.parametrize(
    "response, expected",
    [
        # (pred, strict, em, sub_em, f1), by hand: the last box against the gold "4711"
        ("The memory holds it: \\boxed{4711}", ("4711", 1.0, 1.0, 1.0, 1.0)),
        ("\\boxed{4712}", ("4712", 0.0, 0.0, 0.0, 0.0)),
        # one of three tokens is the gold: precision 1/3, recall 1, f1 = 2 (1/3) / (4/3) = 0.5; the gold is inside
        ("\\boxed{4711 or 4712}", ("4711 or 4712", 0.0, 0.0, 1.0, 0.5)),
        ("4711", (None, 0.0, 0.0, 0.0, 0.0)),  # no box: nothing extracted
    ],
)
def test_needle_is_scored_as_qa_strict_and_lenient(response, expected):
    got = scoring.score("needle", "boxed", response, ["4711"])
    assert (got["pred"], got["strict"], got["em"], got["sub_em"], got["f1"]) == expected
    assert scoring.failed("needle") == {"pred": None, "strict": 0.0, "em": 0, "sub_em": 0, "f1": 0}


def test_reader_table_has_the_replications_budgets(tmp_path):
    folders = {}
    for name in ("warm-start", "rl-seed0"):
        folders[name] = tmp_path / name
        folders[name].mkdir()
        (folders[name] / "config.json").write_text("{}")
    out = tmp_path / "readers.yaml"
    assert eval_models.main(["--out", str(out), *(f"{n}={f}" for n, f in folders.items())]) == 0
    table = cfg.load_table(out)
    assert [e.name for e in table] == ["warm-start", "rl-seed0"]
    assert [e.checkpoint for e in table] == [str(folders["warm-start"]), str(folders["rl-seed0"])]
    for entry in table:
        assert entry.memory == cfg.MemoryBudget(chunk_size=64, max_new=32, final_max_new=16, max_context=None)
        assert entry.direct == cfg.DirectBudget(max_input=360, max_output=16)
        assert (entry.method, entry.serve, entry.group, entry.concurrency) == (
            "memory-boxed",
            "transformers",
            "replication",
            8,
        )
        assert entry.transformers_args[0] == "--continuous-batching"
    assert cfg.select_models(table, None) == table  # a table without the paper's groups: all of it by default

    eval_models.main(["--out", str(out), "--no-batching", f"warm-start={folders['warm-start']}"])
    (entry,) = cfg.load_table(out)
    assert (entry.concurrency, entry.transformers_args) == (1, ())
    with pytest.raises(SystemExit):
        eval_models.main(["--out", str(out), f"x={tmp_path / 'missing'}"])


def reader_entry() -> cfg.ModelEntry:
    (entry,) = [cfg._entry({"name": "r", "checkpoint": "r"}, eval_models.defaults())]
    return entry


def test_the_harness_sends_the_training_prompts(tokenizer):
    """Each prompt the harness sends (text, chat template applied by the server) is, token for token, the prompt
    the replication trained on (agent_config, prompts built in token space), with the same budgets."""
    doc = make_document(random.Random(5), tokenizer, 3, "test")
    harness = make_workflow(reader_entry(), "memory-boxed", tokenizer)(
        {"input": doc["question"], "context": doc["context"]}
    )
    training = MemoryWorkflow(agent_config(), tokenizer).episode({"context": doc["context"], "prompt": doc["question"]})
    texts = ["The farmer painted a tall tree.", doc["needle"], doc["needle"], "\\boxed{4711}"]
    sent = run_scripted(harness, lambda n, turn: Reply(texts[n], "stop", None))
    trained = run_scripted(
        training, lambda n, turn: Reply(texts[n], "stop", tokenizer.encode(texts[n], add_special_tokens=False))
    )
    for ours, theirs in zip(sent, trained, strict=True):
        ids = tokenizer.apply_chat_template(ours.messages, add_generation_prompt=True, return_dict=True)["input_ids"]
        assert ids == theirs.prompt_ids
    assert [(ours.max_tokens, theirs.max_tokens) for ours, theirs in zip(sent, trained, strict=True)] == [
        (32, 32),
        (32, 32),
        (32, 32),
        (16, 16),
    ]
    assert harness.answer == training.answer == "\\boxed{4711}"


def test_the_direct_baseline_fits_the_readers_window(tokenizer):
    session_of = make_workflow(reader_entry(), "direct-boxed", tokenizer)
    long_context = " ".join(["The baker painted a tall tree after lunch."] * 300 + [NEEDLE])  # ~3,000 tokens
    for context, truncated in ((f"A dog ran. {NEEDLE}", False), (long_context, True)):
        session = session_of({"input": QUESTION, "context": context})
        (turn,) = run_scripted(session, lambda n, turn: Reply("\\boxed{4711}", "stop"))
        ids = tokenizer.apply_chat_template(turn.messages, add_generation_prompt=True, return_dict=True)["input_ids"]
        assert session.trace()["truncated"] is truncated and turn.max_tokens == 16
        assert len(ids) + turn.max_tokens <= 416  # the reader's training context
    assert session.trace()["prompt_tokens_full"] > 2000 and len(ids) >= 380  # the long one is cut to the window


def greedy_reply(model, tokenizer, messages: list[dict], max_tokens: int) -> str:
    """What `transformers serve` does for one request, in process and one at a time: chat template, greedy
    generate, decode without special tokens."""
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)["input_ids"]
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=max_tokens, do_sample=False)
    return tokenizer.decode(out[0, len(ids) :], skip_special_tokens=True)


@pytest.mark.slow
def test_a_reader_through_transformers_serve_with_batching_answers_as_greedy_generate(tokenizer, tmp_path):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    config = reader_config(tokenizer, hidden=32, layers=1, heads=2, kv_heads=1)
    config.initializer_range = 0.5  # wide logit gaps: no near-ties for batched float sums to flip
    model = AutoModelForCausalLM.from_config(config).eval()
    folder = tmp_path / "reader"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    data = tmp_path / "data"
    rng = random.Random(0)
    docs = {n: [make_document(rng, tokenizer, n, "test") for _ in range(2)] for n in (1, 2)}
    for n, items in docs.items():
        write_set(
            data,
            n,
            [
                {"index": i, "input": d["question"], "context": d["context"], "answers": [d["value"]]}
                for i, d in enumerate(items)
            ],
        )
    table = tmp_path / "readers.yaml"
    table.write_text(yaml.safe_dump(eval_models.table({"tiny-reader": folder})))
    results = tmp_path / "results"
    # fmt: off
    argv = ["--table", str(table), "--tasks", "needle", "--lengths", "1,2", "--data-dir", str(data),
            "--results-dir", str(results), "--method", "memory-boxed,direct-boxed", "--temperature", "0", "--trace",
            "--no-report", "--quiet"]
    # fmt: on
    assert run_main(argv) == 0
    log = (results / "logs" / "transformers-tiny-reader.log").read_text(errors="replace")
    assert "CB: True" in log and "CB: False" not in log  # the server's own word: every request was batched

    for n, items in docs.items():
        memory = {r["id"]: r for r in map(json.loads, (results / f"needle_{n}/tiny-reader__memory-boxed.jsonl").open())}
        direct = {r["id"]: r for r in map(json.loads, (results / f"needle_{n}/tiny-reader__direct-boxed.jsonl").open())}
        assert sorted(memory) == sorted(direct) == [0, 1]
        for i, doc in enumerate(items):
            session = MemoryWorkflow(agent_config(), tokenizer, token_prompts=False).episode(
                {"context": doc["context"], "prompt": doc["question"]}
            )
            run_scripted(
                session, lambda n, turn: Reply(greedy_reply(model, tokenizer, turn.messages, turn.max_tokens), "stop")
            )
            expected = [rec.reply.text for rec in session.history]
            assert len(expected) == n + 1 and memory[i]["turns"] == n + 1
            assert [t["response"] for t in memory[i]["trace"]] == expected
            (turn,) = run_scripted(
                make_workflow(reader_entry(), "direct-boxed", tokenizer)(
                    {"input": doc["question"], "context": doc["context"]}
                ),
                lambda n, turn: Reply("x", "stop"),
            )
            assert direct[i]["response"] == greedy_reply(model, tokenizer, turn.messages, 16)
