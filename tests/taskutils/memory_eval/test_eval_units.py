"""Harness logic without a model server: the direct baseline's prompt and truncation, scoring per method, the
model table and task plans, resumable results files, and the report's arithmetic (hand-computed)."""

from __future__ import annotations

import asyncio
import csv
import json

import pytest
from eval_fixtures import hotpotqa_set, read_lines
from transformers import AutoTokenizer

from recurrent.async_manager import run_session
from recurrent.impls.direct import TEMPLATE_0SHOT, DirectConfig, DirectWorkflow
from recurrent.interface import Reply
from taskutils.memory_eval import config as cfg
from taskutils.memory_eval import evalsets, results, scoring
from taskutils.memory_eval.report import collect, markdown, plot, table2, write_report
from taskutils.memory_eval.report import main as report_main


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


# ---- the direct baseline ----


class Answers:
    """A model that answers every call with ``reply``, keeping each call whole (its prompt included)."""

    def __init__(self, reply: Reply = Reply("Therefore, the answer is c.", "stop")) -> None:
        self.reply, self.turns = reply, []

    async def send_turn(self, turn, **_) -> Reply:
        self.turns.append(turn)
        return self.reply


def sent_turn(episode):
    """The one call of a direct episode, as sent (its record keeps no prompt)."""
    model = Answers()
    asyncio.run(run_session(episode, model))
    (turn,) = model.turns
    return turn


def test_direct_prompt_is_the_paper_template_when_it_fits(tokenizer):
    workflow = DirectWorkflow(DirectConfig(max_input=10_000, max_output=7), tokenizer)
    session = workflow.episode({"input": " Who? ", "context": "  some text  "})
    turn = sent_turn(session)
    # The paper's 0-shot layout written out by hand, with the context and question stripped.
    expected = (
        "Please read the following text and answer the question below.\n\n<text>\nsome text\n</text>\n\nWho?\n\n"
        'Format your response as follows: "Therefore, the answer is (insert answer here)".'
    )
    assert turn.messages == [{"role": "user", "content": expected}]
    assert turn.max_tokens == 7 and turn.final
    assert not session.trace()["truncated"]


def test_direct_prompt_is_middle_truncated_in_token_space(tokenizer):
    context = " ".join(f"word{i}" for i in range(3000))
    workflow = DirectWorkflow(DirectConfig(max_input=200, max_output=5, final_prompt="boxed"), tokenizer)
    session = workflow.episode({"input": "Which word comes first?", "context": context})
    text = sent_turn(session).messages[0]["content"]
    full = tokenizer.encode(TEMPLATE_0SHOT.format(context=context, question="x"), add_special_tokens=False)
    trace = session.trace()
    assert trace["truncated"] and trace["prompt_tokens_full"] > len(full) - 50
    sent = tokenizer.encode(text, add_special_tokens=False)
    assert abs(len(sent) - 200) <= 4  # 100 head + 100 tail tokens, re-encoded at the seam
    # Head and tail survive (instruction and question), the middle of the document is gone.
    assert text.startswith("Please read the following text") and text.endswith("Put the answer in \\boxed{}.")
    assert "Which word comes first?" in text and "word1500" not in text


def test_direct_episode_is_one_final_call(tokenizer):
    session = DirectWorkflow(DirectConfig(100, 5), tokenizer).episode({"input": "q", "context": "c"})
    model = Answers(Reply("Therefore, the answer is c.", "stop", prompt_tokens=9, completion_tokens=4))
    asyncio.run(run_session(session, model))
    assert len(model.turns) == 1 and model.turns[0].final and model.turns[0].meta["kind"] == "direct"
    assert session.answer == "Therefore, the answer is c." and len(session.history) == 1
    assert session.history[0].turn.final and session.history[0].turn.messages == []  # prompt not kept
    assert session.trace()["turns"][0]["prompt_tokens"] == 9
    with pytest.raises(RuntimeError, match="an episode runs once"):
        asyncio.run(run_session(session, model))


# ---- scoring ----


def test_scores_per_method_and_task():
    answer_is = scoring.score("hotpotqa", "answer_is", "Therefore, the answer is Paris.", ["Paris", "paris"])
    assert answer_is == {"pred": "Paris", "strict": 0.0, "em": 1.0, "sub_em": 1.0, "f1": 1.0}  # no box: strict 0
    boxed = scoring.score("hotpotqa", "boxed", "so \\boxed{the Paris}", ["Paris"])
    assert boxed["strict"] == 0.0 and boxed["sub_em"] == 1.0 and boxed["em"] == 1.0  # strict keeps articles
    assert scoring.score("hotpotqa", "boxed", "\\boxed{paris}", ["Paris"])["strict"] == 1.0
    ruler = scoring.score("niah_multivalue", "answer_is", "the answer is 123 and 999", ["123", "456"])
    assert ruler == {"pred": "123 and 999", "strict": 0.0, "em": None, "sub_em": 0.5, "f1": None}
    assert scoring.score("vt", "boxed", "\\boxed{A B}", ["a", "b", "c"])["sub_em"] == 0.67
    assert scoring.score("vt", "answer_is", "The answer is X", ["x"])["sub_em"] == 0  # case-sensitive trigger
    assert scoring.score("qa_1", "answer_is", "the answer is Bob", ["Bob"])["f1"] == 1.0  # QA task: em/f1 apply
    assert scoring.failed("hotpotqa") == {"pred": None, "strict": 0.0, "em": 0, "sub_em": 0, "f1": 0}
    assert scoring.failed("vt")["em"] is None
    assert scoring.golds({"outputs": ["1", 2]}) == ["1", "2"] and scoring.golds({"answers": "x"}) == ["x"]


# ---- model table and task plans ----


def test_default_table_is_the_papers():
    table = cfg.load_table()
    default = cfg.select_models(table, None)
    assert len(default) == 14 and all(e.group in ("paper", "ablation") for e in default)
    by_name = {e.name: e for e in table}
    mem14 = by_name["MemoryAgent-14B-5k-1k-infty"]
    assert (mem14.checkpoint, mem14.tp, mem14.method, mem14.concurrency) == (
        "BytedTsinghua-SIA/RL-MemoryAgent-14B",
        2,
        "memory",
        256,
    )
    assert mem14.memory == cfg.MemoryBudget(5000, 1024, 1024, None)
    assert by_name["L1-120k+10k"].concurrency == 128 and by_name["L1-120k+10k"].direct.max_input == 120000
    assert by_name["Qwen-7B-990k+10k"].direct == cfg.DirectBudget(990000, 10000)
    assert {e.name for e in cfg.select_models(table, ["cpu"])} == {"tiny", "smollm2-135m-instruct"}
    adhoc = cfg.select_models(table, ["/models/My-Model"])[0]
    assert (adhoc.name, adhoc.checkpoint, adhoc.method) == ("My-Model", "/models/My-Model", "memory")


def test_a_model_named_twice_or_in_its_group_too_is_evaluated_once():
    table = cfg.load_table()
    # "tiny" twice, then the group "cpu" that holds it again: tiny once, in the order first asked, then SmolLM2
    chosen = [e.name for e in cfg.select_models(table, ["tiny", "tiny", "cpu"])]
    assert chosen == ["tiny", "smollm2-135m-instruct"]
    assert [e.name for e in cfg.select_models(table, ["/m/A", "/m/A"])] == ["A"]  # an ad-hoc checkpoint too


def test_task_plans_are_fresh_and_follow_the_paper():
    table = {e.name: e for e in cfg.load_table()}
    memory, direct = table["MemoryAgent-7B-5k-1k-infty"], table["R1-7B-120k+10k"]
    tasks = cfg.expand_tasks(None)
    assert tasks[0] == "hotpotqa" and len(tasks) == 12
    direct_before = list(cfg.plan(direct, tasks, None))  # a copy, planned before any memory model
    first = cfg.plan(memory, tasks, None)
    for _ in range(3):  # planning a memory model never leaks its over-1M lengths into other plans
        assert cfg.plan(direct, tasks, None) == direct_before
        cfg.plan(memory, tasks, None)
    hqa = [n for t, n in cfg.plan(direct, tasks, None) if t == "hotpotqa"]
    assert hqa == [50, 100, 200, 400, 800, 1600, 3200, 6400]
    assert [n for t, n in first if t == "hotpotqa"][-2:] == [12800, 25600]
    assert ("qa_1", 524288) not in first and ("vt", 524288) in first  # the paper skips qa_1 at 512K
    assert cfg.plan(memory, ["vt"], [1, 2]) == [("vt", 1), ("vt", 2)]
    with pytest.raises(ValueError, match="unknown task"):
        cfg.expand_tasks(["nope"])


def test_items_stream_with_limit_and_ids(tmp_path):
    path = hotpotqa_set(tmp_path, 2, items=5)
    assert evalsets.scan(path) == [10, 11, 12, 13, 14] and evalsets.scan(path, limit=2) == [10, 11]
    assert [i["index"] for i in evalsets.iter_items(path, limit=4, only={11, 13, 14})] == [11, 13]
    plain = tmp_path / "eval_vt_8.jsonl"
    plain.write_text(
        '{"input": "q", "context": "c", "outputs": ["a"]}\n\n{"input": "r", "context": "d", "outputs": ["b"]}\n'
    )
    assert evalsets.scan(plain) == [0, 1] and [i["index"] for i in evalsets.iter_items(plain)] == [0, 1]
    assert evalsets.data_file(tmp_path, "vt", 8) == plain and evalsets.data_file(tmp_path, "vt", 9) is None


# ---- results files: resume, failures, settings ----


def _line(i, error=None, sub_em=1, pred="a"):
    return {
        "id": i,
        "model": "m",
        "method": "memory",
        "sub_em": sub_em,
        "strict": 0.0,
        "em": sub_em,
        "f1": sub_em,
        "error": error,
        "prompt_tokens": 10,
        "completion_tokens": 2,
        "seconds": 1.0,
        "pred": None if error else pred,
    }


def test_resume_cuts_a_half_written_line_and_skips_finished_ids(tmp_path):
    path = results.results_path(tmp_path, "hotpotqa", 50, "org/model", "memory")
    assert path.name == "org_model__memory.jsonl" and path.parent.name == "hotpotqa_50"
    settings = {"method": "memory", "budget": {"chunk_size": 5}}
    assert results.prepare(path, settings) == set()
    lines = [json.dumps(_line(0)), json.dumps(_line(1, error="ChatRequestError: boom"))]
    path.write_text("\n".join(lines) + "\n" + json.dumps(_line(2))[:25])  # killed mid-write
    assert results.prepare(path, settings) == {0, 1}  # the failed item is recorded: not rerun by default
    from recurrent.trace import TraceWriter

    with TraceWriter(path) as writer:  # what the runner appends with: the broken tail is cut first
        writer.write(_line(2))
    assert [r["id"] for r in read_lines(path)] == [0, 1, 2]
    assert results.prepare(path, settings, retry_failed=True) == {0, 2}  # its line is dropped, the item redone
    assert [r["id"] for r in read_lines(path)] == [0, 2]
    with pytest.raises(results.SettingsMismatchError, match="budget"):
        results.prepare(path, {"method": "memory", "budget": {"chunk_size": 6}})
    assert results.prepare(path, {"method": "memory"}, overwrite=True) == set() and not path.exists()


# ---- the report ----


def test_report_counts_failures_in_the_denominator(tmp_path):
    folder = tmp_path / "hotpotqa_50"
    folder.mkdir()
    # item 1 answered in the wrong format: nothing extracted (pred None), 0 for its format
    lines = [_line(0), _line(1, sub_em=0, pred=None), _line(2, error="ChatRequestError: x", sub_em=0), _line(3)]
    (folder / "m__memory.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    results.meta_path(folder / "m__memory.jsonl").write_text(json.dumps({"settings": {}, "expected": 5}))
    ruler = tmp_path / "vt_8192"
    ruler.mkdir()
    (ruler / "m__memory.jsonl").write_text(json.dumps({**_line(0), "em": None, "f1": None}) + "\n")
    rows = collect(tmp_path)
    hqa = next(r for r in rows if r.task == "hotpotqa")
    assert (hqa.n, hqa.expected, hqa.failed, hqa.sub_em, hqa.strict) == (4, 5, 1, 50.0, 0.0)  # 2 of 4, failed = 0
    assert hqa.incomplete and hqa.prompt_tokens == 40 and hqa.no_answer == 1  # the failed item is not counted here
    vt = next(r for r in rows if r.task == "vt")
    assert vt.em is None and vt.sub_em == 100.0 and vt.expected is None
    text = markdown(rows)
    assert "4 lines, eval set has 5" in text and "1 of 4 items failed" in text and "| m | memory | 50.00* |" in text
    assert "hotpotqa_50/m__memory: 1 of 4 answers had no extractable answer (counted as 0)" in text
    assert "| m | memory | hotpotqa | 50 | 4 | 5 | 1 | 1 | 0.00 | 50.00 |" in text  # failed, then no answer
    md, csv_path, png, strict_png, table2_md = write_report(tmp_path)
    assert table2_md.name == "table2.md"  # there are HotpotQA results
    with csv_path.open() as f:
        table = list(csv.DictReader(f))
    assert len(table) == 2 and table[0]["sub_em"] == "50.0" and table[1]["em"] == ""
    assert table[0]["no_answer"] == "1" and table[1]["no_answer"] == "0"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and md.read_text().startswith("# Evaluation summary")
    assert strict_png.name == "strict_vs_length.png" and strict_png.read_bytes()[:4] == b"\x89PNG"
    # each metric's plot carries its own name
    assert plot(rows, tmp_path / "s.png", "strict") == [
        ("RULER-HotpotQA: strict", "strict (%)"),
        ("RULER vt: strict", "strict (%)"),
    ]
    assert plot(rows, tmp_path / "a.png") == [
        ("RULER-HotpotQA: sub_em", "sub_em (%)"),
        ("RULER vt: sub_em", "sub_em (%)"),
    ]


def _results_file(results_dir, folder, model, method, sub_ems, expected=None, error_at=None):
    """A hand-made results file: one line per item with the given sub_em (the item at ``error_at`` failed)."""
    (results_dir / folder).mkdir(parents=True, exist_ok=True)
    lines = [
        {**_line(i, error="ChatRequestError: x" if i == error_at else None, sub_em=v), "model": model, "method": method}
        for i, v in enumerate(sub_ems)
    ]
    path = results_dir / folder / f"{model}__{method}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    meta = {"settings": {}, "expected": expected if expected is not None else len(sub_ems)}
    results.meta_path(path).write_text(json.dumps(meta))


def test_table2_is_the_papers_layout_models_by_length(tmp_path, capsys):
    _results_file(tmp_path, "hotpotqa_50", "agent", "memory", [1, 1, 1, 0])
    _results_file(tmp_path, "hotpotqa_800", "agent", "memory", [1, 1, 0, 0], expected=5)  # one item missing
    _results_file(tmp_path, "hotpotqa_25600", "agent", "memory", [1, 0, 1, 1])
    _results_file(tmp_path, "hotpotqa_50", "base", "memory", [1, 0, 0, 0])
    _results_file(tmp_path, "hotpotqa_800", "base", "memory", [0, 0, 0, 0])
    _results_file(tmp_path, "hotpotqa_50", "base", "direct", [1, 1, 0, 0])
    _results_file(tmp_path, "hotpotqa_800", "base", "direct", [1, 0, 1, 1], error_at=1)  # a failed item counts 0
    _results_file(tmp_path, "vt_8192", "agent", "memory", [1])  # RULER: not in Table 2
    # By hand: 3/4, 2/4 (incomplete: *), 3/4; base with two methods gets a row per method; base was not run at 3.5M.
    # The paper's RL-MemAgent rows at 7K, 112K, 3.5M (its Table 2).
    expected = [
        "| Model | 7K | 112K | 3.5M |",
        "|---|---|---|---|",
        "| agent | 75.00 | 50.00* | 75.00 |",
        "| base (direct) | 50.00 | 75.00* | N/A |",
        "| base (memory) | 25.00 | 0.00 | N/A |",
        "| RL-MemAgent-14B (paper) | 83.59 | 76.56 | 78.12 |",
        "| RL-MemAgent-7B (paper) | 82.03 | 79.69 | 71.09 |",
    ]
    text = table2(collect(tmp_path))
    assert text.startswith("# RULER-HotpotQA accuracy (%) by context length")
    assert [line for line in text.splitlines() if line.startswith("|")] == expected
    assert report_main([str(tmp_path), "--table2"]) == 0
    out = capsys.readouterr().out
    assert str(tmp_path / "table2.md") in out and "\n".join(expected) in out
    assert (tmp_path / "table2.md").read_text() == text

    # lengths outside the paper's grid are labelled by their document count, and get no paper row
    other = tmp_path / "other"
    _results_file(other, "hotpotqa_2", "agent", "memory", [1, 0])
    assert [line for line in table2(collect(other)).splitlines() if line.startswith("|")] == [
        "| Model | 2 docs |",
        "|---|---|",
        "| agent | 50.00 |",
    ]
    # lengths partly on the paper's grid: the paper's rows at its lengths only, each under its own column
    mixed = tmp_path / "mixed"
    for docs, scores in ((2, [1, 0]), (100, [1, 1]), (150, [0, 0]), (1600, [1, 0, 0, 0])):
        _results_file(mixed, f"hotpotqa_{docs}", "agent", "memory", scores)
    # By hand: 100 documents ~ 14K (the paper's 2nd column), 1600 ~ 224K (its 6th); 2 and 150 are not on its grid.
    assert [line for line in table2(collect(mixed)).splitlines() if line.startswith("|")] == [
        "| Model | 2 docs | 14K | 150 docs | 224K |",
        "|---|---|---|---|---|",
        "| agent | 50.00 | 100.00 | 0.00 | 25.00 |",
        "| RL-MemAgent-14B (paper) |  | 82.03 |  | 81.25 |",
        "| RL-MemAgent-7B (paper) |  | 79.69 |  | 72.66 |",
    ]
    # no HotpotQA results: no Table 2
    ruler = tmp_path / "ruler"
    _results_file(ruler, "vt_8192", "agent", "memory", [1])
    assert table2(collect(ruler)) is None
    assert [p.name for p in write_report(ruler)] == [
        "summary.md",
        "summary.csv",
        "accuracy_vs_length.png",
        "strict_vs_length.png",
    ]


def test_run_options_from_a_config_file_and_flags(tmp_path):
    from taskutils.memory_eval.run import parse_args

    config = tmp_path / "run.yaml"
    config.write_text(
        "models: [tiny, smollm2-135m-instruct]\nlengths: [2, 4]\ntasks: hotpotqa\nlimit: 2\nmethod: direct\n"
    )
    args = parse_args(["--config", str(config), "--limit", "3"])
    assert args.models == ["tiny", "smollm2-135m-instruct"] and args.lengths == [2, 4] and args.tasks == ["hotpotqa"]
    assert args.limit == 3 and args.method == ["direct"]  # the command line wins over the file
    assert args.temperature == 0.7 and args.top_p == 0.95  # the paper's sampling
    with pytest.raises(SystemExit):
        parse_args(["--method", "recurrent"])


def test_a_model_that_cannot_be_served_is_skipped_and_reported(tmp_path, caplog, capsys):
    from taskutils.memory_eval.run import main as run_main

    hotpotqa_set(tmp_path, 2, items=1)
    table = tmp_path / "table.yaml"
    table.write_text("models:\n  - {name: missing, checkpoint: no-such-org/no-such-model}\n")
    argv = [
        "--table",
        str(table),
        "--models",
        "missing",
        "--tasks",
        "hotpotqa",
        "--lengths",
        "2",
        "--data-dir",
        str(tmp_path),
        "--results-dir",
        str(tmp_path / "out"),
        "--quiet",
    ]
    assert run_main(argv) == 1
    assert "missing: skipped" in caplog.text
    err = capsys.readouterr().err
    assert "error: model(s) not evaluated: missing" in err and "missing memory hotpotqa_2: 0 failed, 1 not run" in err
