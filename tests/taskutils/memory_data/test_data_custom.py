"""Bring your own data (``python -m taskutils.memory_data custom``): hand-made JSON lines, parquet and ``datasets``
folders, good and bad, into the training parquet (checked by the trainer's own preflight and read by verl's
dataset) and the eval set (read by the harness's loader)."""

import errno
import json
import os
import re
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from taskutils.memory_data.run import main
from taskutils.memory_eval import evalsets, scoring

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "tests" / "verl_ext"))  # vx_helpers.compose_config: the configs as the suite composes

# Three records in the README's shape: documents as strings or {title, text}, answers as a list or one string.
RECORDS = [
    {
        "question": "Which town hosts the observatory?",
        "answers": ["Arecibo"],
        "documents": ["The observatory was built in Arecibo.", {"title": "Puerto Rico", "text": "A Caribbean island."}],
    },
    {
        "question": "Who wrote the notes?",
        "answers": "Ada Lovelace",
        "documents": ["The notes were written by Ada Lovelace.", "They appeared in 1843."],
    },
    {
        "question": "When did the notes appear?",
        "answers": ["1843", "in 1843"],
        "documents": ["They appeared in 1843."],
    },
]
# The contexts, written out by hand: "Document i:" blocks, blank lines between, a title on its own line.
CONTEXTS = [
    "Document 1:\nThe observatory was built in Arecibo.\n\nDocument 2:\nPuerto Rico\nA Caribbean island.",
    "Document 1:\nThe notes were written by Ada Lovelace.\n\nDocument 2:\nThey appeared in 1843.",
    "Document 1:\nThey appeared in 1843.",
]
ANSWERS = [["Arecibo"], ["Ada Lovelace"], ["1843", "in 1843"]]


def write_jsonl(path: Path, records: list, raw_lines: dict[int, str] | None = None) -> Path:
    """``records`` one per line; ``raw_lines`` replaces line k (from 1) with text as it is."""
    lines = [json.dumps(r) for r in records]
    for k, text in (raw_lines or {}).items():
        lines[k - 1] = text
    path.write_text("\n".join(lines) + "\n")
    return path


def run(argv: list, capsys) -> tuple[int, str, str]:
    code = main(["custom", *map(str, argv)])
    out = capsys.readouterr()
    return code, out.out, out.err


def parquet_rows(path: Path) -> list[dict]:
    return pq.read_table(path).to_pylist()


# -- good inputs ------------------------------------------------------------------------------------------


def test_jsonl_with_documents_makes_training_rows_and_an_eval_set(tmp_path, capsys):
    src = write_jsonl(tmp_path / "qa.jsonl", RECORDS)
    train, eval_out = tmp_path / "out" / "train.parquet", tmp_path / "out" / "eval" / "eval_7.jsonl"
    code, out, err = run([src, "--documents-field", "documents", "--train-out", train, "--eval-out", eval_out], capsys)
    assert (code, err) == (0, "")
    rows = parquet_rows(train)
    assert rows == [
        {
            "data_source": "custom",
            "prompt": [{"role": "user", "content": r["question"]}],
            "context": context,
            "ability": "memory",
            "reward_model": {"style": "rule", "ground_truth": answers},
            "extra_info": {"index": i, "question": r["question"], "num_docs": len(r["documents"])},
        }
        for i, (r, context, answers) in enumerate(zip(RECORDS, CONTEXTS, ANSWERS, strict=True))
    ]
    items = [json.loads(line) for line in eval_out.read_text().splitlines()]
    assert items == [
        {"index": i, "input": r["question"], "context": c, "answers": a, "num_docs": len(r["documents"])}
        for i, (r, c, a) in enumerate(zip(RECORDS, CONTEXTS, ANSWERS, strict=True))
    ]
    assert f"training rows        3 -> {train}" in out
    assert f"--data-dir {eval_out.parent} --tasks hotpotqa --lengths 7" in out
    assert sorted(p.name for p in (tmp_path / "out").rglob("*")) == ["eval", "eval_7.jsonl", "train.parquet"]


def test_the_training_schema_is_the_hotpotqa_builders(tmp_path, capsys):
    src = write_jsonl(tmp_path / "qa.jsonl", RECORDS)
    run([src, "--documents-field", "documents", "--train-out", tmp_path / "t.parquet"], capsys)
    written = pq.read_schema(tmp_path / "t.parquet")
    # The paper's training parquet, column for column (what hotpotqa-process writes).
    expected = pa.schema(
        [
            ("data_source", pa.string()),
            ("prompt", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
            ("context", pa.string()),
            ("ability", pa.string()),
            ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.list_(pa.string()))])),
            ("extra_info", pa.struct([("index", pa.int64()), ("question", pa.string()), ("num_docs", pa.int64())])),
        ]
    )
    assert written.remove_metadata().equals(expected)


def test_parquet_with_a_context_text_and_dotted_answers(tmp_path, capsys):
    # SQuAD-style answers ({"text": [...], "answer_start": [...]}) reached with a dotted field name.
    src = tmp_path / "squad_like.parquet"
    table = [
        {
            "q": "Where is the key?",
            "ctx": "The key is under the mat.",
            "ans": {"text": ["under the mat"], "start": [11]},
        },
        {"q": "What colour is the door?", "ctx": "The door is red.", "ans": {"text": ["red"], "start": [12]}},
    ]
    pq.write_table(pa.Table.from_pylist(table), src)
    train, val = tmp_path / "train.parquet", tmp_path / "val.parquet"
    argv = [src, "--question-field", "q", "--context-field", "ctx", "--answers-field", "ans.text"]
    code, _, err = run([*argv, "--train-out", train, "--val-out", val, "--data-source", "mine"], capsys)
    assert (code, err) == (0, "")
    rows = parquet_rows(train)
    assert [(r["prompt"][0]["content"], r["context"], r["reward_model"]["ground_truth"]) for r in rows] == [
        ("Where is the key?", "The key is under the mat.", ["under the mat"]),
        ("What colour is the door?", "The door is red.", ["red"]),
    ]
    assert {r["data_source"] for r in rows} == {"mine"}
    assert [r["extra_info"]["num_docs"] for r in rows] == [None, None]  # one text, not documents
    assert parquet_rows(val) == rows  # without --eval-fraction every output gets every record


def test_a_datasets_folder_and_a_split_of_a_dataset_dict(tmp_path, capsys):
    from datasets import Dataset, DatasetDict

    flat = [
        {"question": r["question"], "answers": a, "context": c}
        for r, a, c in zip(RECORDS, ANSWERS, CONTEXTS, strict=True)
    ]
    Dataset.from_list(flat).save_to_disk(str(tmp_path / "single"))
    DatasetDict({"train": Dataset.from_list(flat[:2]), "test": Dataset.from_list(flat[2:])}).save_to_disk(
        str(tmp_path / "dict")
    )
    capsys.readouterr()  # the saving's progress bars
    code, _, err = run([tmp_path / "single", "--train-out", tmp_path / "a.parquet"], capsys)
    assert (code, err) == (0, "")
    assert [r["context"] for r in parquet_rows(tmp_path / "a.parquet")] == CONTEXTS

    code, _, err = run([tmp_path / "dict", "--train-out", tmp_path / "b.parquet"], capsys)
    assert code == 2
    assert f"{tmp_path / 'dict'}: a datasets folder with splits train, test; no --split given" in err
    code, _, err = run([tmp_path / "dict", "--split", "test", "--train-out", tmp_path / "b.parquet"], capsys)
    assert (code, err) == (0, "")
    assert [r["reward_model"]["ground_truth"] for r in parquet_rows(tmp_path / "b.parquet")] == [ANSWERS[2]]


def test_several_inputs_are_one_data_set_indexed_in_order(tmp_path, capsys):
    a = write_jsonl(tmp_path / "a.jsonl", RECORDS[:2])
    b = write_jsonl(tmp_path / "b.jsonl", RECORDS[2:])
    code, _, _ = run([a, b, "--documents-field", "documents", "--eval-out", tmp_path / "eval_1.jsonl"], capsys)
    assert code == 0
    items = [json.loads(line) for line in (tmp_path / "eval_1.jsonl").read_text().splitlines()]
    assert [(i["index"], i["input"]) for i in items] == [(k, r["question"]) for k, r in enumerate(RECORDS)]


def test_eval_fraction_holds_out_a_seeded_disjoint_part(tmp_path, capsys):
    records = [{"question": f"q{i}?", "answers": [f"a{i}"], "context": f"c{i}"} for i in range(20)]
    src = write_jsonl(tmp_path / "qa.jsonl", records)

    def split(seed: int, tag: str) -> tuple[list[int], list[int], list[int]]:
        train, val, ev = tmp_path / f"t{tag}.parquet", tmp_path / f"v{tag}.parquet", tmp_path / tag / "eval_1.jsonl"
        argv = [src, "--eval-fraction", "0.25", "--seed", seed, "--train-out", train, "--val-out", val]
        assert run([*argv, "--eval-out", ev], capsys)[0] == 0
        items = [json.loads(line) for line in ev.read_text().splitlines()]
        return (
            [r["extra_info"]["index"] for r in parquet_rows(train)],
            [r["extra_info"]["index"] for r in parquet_rows(val)],
            [i["index"] for i in items],
        )

    train, val, ev = split(42, "x")
    assert len(ev) == 5 and val == ev  # round(0.25 * 20); the validation rows are the eval items
    assert sorted(train + ev) == list(range(20)) and train == sorted(train)  # disjoint, input order kept
    assert split(42, "y") == (train, val, ev)  # same seed, same split
    assert split(7, "z")[2] != ev  # another seed, another draw (5 of 20: 15,504 possible sets)
    # The held-out item is the input record at its index, not some other one.
    item = json.loads((tmp_path / "x" / "eval_1.jsonl").read_text().splitlines()[0])
    assert (item["input"], item["context"]) == (f"q{item['index']}?", f"c{item['index']}")


# -- the trainer and the harness read what comes out --------------------------------------------------------


def test_the_trainer_preflight_and_verl_dataset_accept_the_training_rows(tmp_path, capsys, tiny_model_dir):
    from transformers import AutoTokenizer
    from verl.trainer.ppo.utils import create_rl_dataset
    from vx_helpers import TINY_BUDGETS, compose_config

    from verl_ext.preflight import preflight

    src = write_jsonl(tmp_path / "qa.jsonl", RECORDS)
    train, val = tmp_path / "train.parquet", tmp_path / "dev.parquet"
    argv = [src, "--documents-field", "documents", "--eval-fraction", "0.34", "--train-out", train, "--val-out", val]
    assert run(argv, capsys)[0] == 0
    overrides = [f"data.train_files={train}", f"data.val_files={val}", f"actor_rollout_ref.model.path={tiny_model_dir}"]
    config = compose_config("tiny_cpu", [*TINY_BUDGETS, *overrides])
    preflight(config, load_tokenizer=False)  # raises PreflightError listing any missing column

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    dataset = create_rl_dataset(config.data.train_files, config.data, tokenizer, None, is_train=True)
    assert len(dataset) == 2
    sample = dataset[0]
    index = sample["extra_info"]["index"]
    assert sample["raw_prompt"] == [{"role": "user", "content": RECORDS[index]["question"]}]
    assert sample[config.recurrent.config.context_key] == CONTEXTS[index]
    assert list(sample["reward_model"]["ground_truth"]) == ANSWERS[index]


def test_the_harness_loads_the_eval_set(tmp_path, capsys):
    src = write_jsonl(tmp_path / "qa.jsonl", RECORDS)
    data_dir = tmp_path / "eval"
    assert run([src, "--documents-field", "documents", "--eval-out", data_dir / "eval_3.jsonl"], capsys)[0] == 0
    path = evalsets.data_file(data_dir, "hotpotqa", 3)  # how `--tasks hotpotqa --lengths 3` finds it
    assert path == data_dir / "eval_3.jsonl"
    assert evalsets.scan(path) == [0, 1, 2]  # every item checked as before a model call
    items = list(evalsets.iter_items(path))
    assert [(i["input"], i["context"], scoring.golds(i)) for i in items] == [
        (r["question"], c, a) for r, c, a in zip(RECORDS, CONTEXTS, ANSWERS, strict=True)
    ]


# -- bad inputs: every problem names the file, the line or row, and the field --------------------------------


def test_bad_json_lines_are_all_reported_and_nothing_is_written(tmp_path, capsys):
    good = {"question": "q?", "answers": ["a"], "context": "c"}
    records = [
        good,
        {"question": "  ", "answers": [], "context": "c"},  # 2
        {"question": "q?", "answers": ["a", 3], "context": 5},  # 3
        good,  # 4: replaced by a broken line
        good,  # 5: replaced by an array
        {"q": "q?", "answers": "a"},  # 6
        {"question": "q?", "answers": {"text": "a"}, "context": None},  # 7
        good,  # 8: the question and context of line 1
    ]
    src = write_jsonl(tmp_path / "bad.jsonl", records, {4: '{"question": "q?" "answers": ["a"]}', 5: "[1, 2]"})
    train = tmp_path / "train.parquet"
    train.write_bytes(b"an older file")
    code, out, err = run([src, "--train-out", train], capsys)
    assert (code, out) == (2, "")
    assert err.splitlines() == [
        "error: 11 problem(s) in 7 of 8 records; nothing was written:",
        f"  {src}:2 field 'question': empty",
        f"  {src}:2 field 'answers': an empty list (at least one answer is needed)",
        f"  {src}:3 field 'answers[1]': must be text, got int 3",
        f"  {src}:3 field 'context': must be text, got int 5",
        f"  {src}:4: not valid JSON (Expecting ',' delimiter: line 1 column 19 (char 18))",
        f"  {src}:5: a record must be an object, got list [1, 2]",
        f"  {src}:6 field 'question': missing; the record has answers, q",
        f"  {src}:6 field 'context': missing; the record has answers, q",
        f"  {src}:7 field 'answers': must be a string or a list of strings, got dict {{'text': 'a'}}",
        f"  {src}:7 field 'context': null",
        f"  {src}:8: the same question and context as {src}:1 (a duplicate); --duplicates keep-first keeps the "
        "first of each",
    ]
    assert train.read_bytes() == b"an older file"  # untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl", "train.parquet"]  # no temporary left


def test_bad_documents_name_the_document(tmp_path, capsys):
    docs = [["ok", ""], [{"title": "T"}], [{"title": 3, "text": "x"}], [], "one text"]
    src = write_jsonl(tmp_path / "d.jsonl", [{"question": "q?", "answers": ["a"], "docs": d} for d in docs])
    code, _, err = run([src, "--documents-field", "docs", "--train-out", tmp_path / "t.parquet"], capsys)
    assert code == 2
    assert err.splitlines()[1:] == [
        f"  {src}:1 field 'docs[1]': empty",
        f"  {src}:2 field 'docs[0]': an object without 'text'; it has title",
        f"  {src}:3 field 'docs[0].title': must be text, got int 3",
        f"  {src}:4 field 'docs': an empty list",
        f"  {src}:5 field 'docs': must be a list of documents, got str 'one text'",
    ]


def test_bad_parquet_and_datasets_rows_are_named_by_row(tmp_path, capsys):
    from datasets import Dataset

    rows = [
        {"question": "q?", "answers": ["a"], "context": "c"},
        {"question": "q?", "answers": ["a"], "context": ""},
        {"question": None, "answers": ["a"], "context": "c"},
    ]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "bad.parquet")
    Dataset.from_list(rows).save_to_disk(str(tmp_path / "bad_ds"))
    capsys.readouterr()  # the saving's progress bars
    code, _, err = run([tmp_path / "bad.parquet", tmp_path / "bad_ds", "--train-out", tmp_path / "t.parquet"], capsys)
    assert code == 2
    assert err.splitlines() == [
        "error: 5 problem(s) in 5 of 6 records; nothing was written:",
        f"  {tmp_path / 'bad.parquet'}: row 1 field 'context': empty",
        f"  {tmp_path / 'bad.parquet'}: row 2 field 'question': null",
        # the same good row in both inputs: one data set, so a duplicate across them
        f"  {tmp_path / 'bad_ds'}: row 0: the same question and context as {tmp_path / 'bad.parquet'}: row 0 (a "
        "duplicate); --duplicates keep-first keeps the first of each",
        f"  {tmp_path / 'bad_ds'}: row 1 field 'context': empty",
        f"  {tmp_path / 'bad_ds'}: row 2 field 'question': null",
    ]


def test_the_list_of_problems_is_capped(tmp_path, capsys):
    src = write_jsonl(tmp_path / "q.jsonl", [{"question": "q?", "answers": [], "context": "c"}] * 30)
    code, _, err = run([src, "--train-out", tmp_path / "t.parquet"], capsys)
    lines = err.splitlines()
    assert code == 2
    assert lines[0] == "error: 30 problem(s) in 30 of 30 records; nothing was written:"
    assert lines[1:21] == [
        f"  {src}:{k} field 'answers': an empty list (at least one answer is needed)" for k in range(1, 21)
    ]
    assert lines[21:] == ["  ... and 10 more"]


def test_options_and_inputs_are_checked_before_anything_is_read(tmp_path, capsys):
    (tmp_path / "folder").mkdir()
    (tmp_path / "data.csv").write_text("question,answers\n")
    argv = [tmp_path / "missing.jsonl", tmp_path / "folder", tmp_path / "data.csv", "--eval-fraction", "1.5"]
    code, _, err = run([*argv, "--train-out", tmp_path / "t.txt", "--eval-out", tmp_path / "mine.jsonl"], capsys)
    assert code == 2
    assert err.splitlines() == [
        "error: cannot start (nothing was read or written):",
        f"  --train-out {tmp_path / 't.txt'}: must end in .parquet (verl's dataset reads parquet)",
        f"  --eval-out {tmp_path / 'mine.jsonl'}: the harness finds eval sets by name; call it eval_N.jsonl (N: a "
        "number to select it with, --lengths N)",
        "  --eval-fraction 1.5: must be between 0 and 1",
        f"  {tmp_path / 'missing.jsonl'}: no such file or folder",
        f"  {tmp_path / 'folder'}: a folder, but not one written by datasets' save_to_disk (no state.json or "
        "dataset_dict.json)",
        f"  {tmp_path / 'data.csv'}: unknown input kind '.csv': JSON lines (.jsonl, .json, .ndjson), parquet "
        "(.parquet) or a datasets save_to_disk folder",
    ]
    code, _, err = run([tmp_path / "data.csv"], capsys)
    assert "no output: give --train-out, --val-out and/or --eval-out" in err


def test_a_json_array_is_refused_with_how_to_convert(tmp_path, capsys):
    (tmp_path / "a.json").write_text(json.dumps(RECORDS, indent=1))
    code, _, err = run([tmp_path / "a.json", "--eval-out", tmp_path / "eval_1.jsonl"], capsys)
    assert code == 2
    assert f"{tmp_path / 'a.json'}:1: a JSON array; this command reads JSON lines" in err


def test_a_failed_write_leaves_no_output_at_all(tmp_path, capsys):
    # The eval set cannot be written (its folder would be a file): the training parquet, complete by then,
    # must not appear either, so a half-made data set is never mistaken for a whole one. One line says so.
    src = write_jsonl(tmp_path / "qa.jsonl", RECORDS)
    (tmp_path / "blocked").write_text("a file, not a folder")
    argv = [src, "--documents-field", "documents", "--train-out", tmp_path / "t.parquet"]
    code, out, err = run([*argv, "--eval-out", tmp_path / "blocked" / "eval_1.jsonl"], capsys)
    assert (code, out) == (1, "")
    assert err.startswith(f"error: cannot go on: {tmp_path / 'blocked'}: ") and len(err.splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blocked", "qa.jsonl"]


@pytest.mark.parametrize("kind", ["train", "eval"])
def test_a_full_disk_is_one_line_and_leaves_no_output(tmp_path, capsys, monkeypatch, kind):
    # A disk cannot be filled in a test: the writer fails as a full disk makes it fail, after part of its file.
    from taskutils.memory_data import custom_outputs

    def full_disk(rows, dest, *rest):
        Path(dest).write_bytes(b"part of a file")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # a write to an open file: no file named

    monkeypatch.setattr(custom_outputs, "write_parquet" if kind == "train" else "write_eval_set", full_disk)
    src = write_jsonl(tmp_path / "qa.jsonl", RECORDS)
    outputs = {"train": tmp_path / "out" / "t.parquet", "eval": tmp_path / "out" / "eval_1.jsonl"}
    code, out, err = run(
        [src, "--documents-field", "documents", "--train-out", outputs["train"], "--eval-out", outputs["eval"]], capsys
    )
    assert (code, out) == (1, "")
    assert err.splitlines() == [
        f"error: cannot go on: {outputs[kind]}: No space left on device (ENOSPC); free some space, then run the "
        "same command again: no output is left half-written under its own name"
    ]
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["out", "qa.jsonl"]  # no temporary file either


def test_json_nested_too_deep_is_named_by_its_line(tmp_path, capsys):
    # 100,000 arrays in one another: json.loads raised RecursionError, a traceback instead of a problem.
    src = write_jsonl(tmp_path / "qa.jsonl", RECORDS[:2], {2: "[" * 100_000 + "]" * 100_000})
    code, out, err = run([src, "--documents-field", "documents", "--eval-out", tmp_path / "eval_1.jsonl"], capsys)
    assert (code, out) == (2, "")
    assert err.splitlines() == [
        "error: 1 problem(s) in 1 of 2 records; nothing was written:",
        f"  {src}:2: JSON nested too deep to read (100,000 levels at its deepest)",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["qa.jsonl"]


def test_a_lone_surrogate_is_refused_naming_line_and_field(tmp_path, capsys):
    # "\ud800" is half of a pair: the record passed its checks, then the parquet writer raised UnicodeEncodeError.
    good = {"question": "Who?", "answers": ["A"], "documents": ["A did it."]}
    records = [
        good | {"question": "Wh\ud800o?"},
        good | {"answers": ["A", "\udfffB"]},
        good | {"documents": ["A did it.", {"title": "T\udc00", "text": "B."}]},
        good | {"documents": ["A did it.", "x\ud83d"], "question": "Why?"},
        good | {"id": "\ud800", "question": "How?"},
        good | {"question": "Which? \ud83d\ude00"},  # a whole pair: one character, kept
    ]
    src = write_jsonl(tmp_path / "qa.jsonl", records)
    train = tmp_path / "t.parquet"
    code, out, err = run([src, "--documents-field", "documents", "--train-out", train], capsys)
    assert (code, out) == (2, "")
    why = (
        "not a character, UTF-8 cannot hold it (a \\ud800-\\udfff escape is half of a pair; write the whole character)"
    )
    assert err.splitlines() == [
        "error: 5 problem(s) in 5 of 6 records; nothing was written:",
        f"  {src}:1 field 'question': a lone surrogate, '\\ud800' at character 2: {why}",
        f"  {src}:2 field 'answers[1]': a lone surrogate, '\\udfff' at character 0: {why}",
        f"  {src}:3 field 'documents[1].title': a lone surrogate, '\\udc00' at character 1: {why}",
        f"  {src}:4 field 'documents[1]': a lone surrogate, '\\ud83d' at character 1: {why}",
        f"  {src}:5 field 'id': a lone surrogate, '\\ud800' at character 0: {why}",
    ]
    assert not train.exists()


def test_with_a_tokenizer_lengths_are_reported_and_long_questions_refused(tmp_path, capsys, tiny_tokenizer):
    src = write_jsonl(tmp_path / "qa.jsonl", RECORDS)
    argv = [src, "--documents-field", "documents", "--tokenizer", "tiny", "--train-out", tmp_path / "t.parquet"]
    code, out, _ = run(argv, capsys)
    assert code == 0
    counts = sorted(len(tiny_tokenizer.encode(c, add_special_tokens=False)) for c in CONTEXTS)
    median = counts[1]
    assert f"context tokens: min {counts[0]:,}, median {median:,}, max {counts[2]:,}" in out
    assert "0 context(s) over 40,000 tokens" in out  # the paper's 8 chunks x 5000 tokens

    longest = max(len(tiny_tokenizer.encode(r["question"], add_special_tokens=False)) for r in RECORDS)
    code, _, err = run([*argv, "--max-question-tokens", longest - 1], capsys)
    assert code == 2
    over = [
        (k, n)
        for k, r in enumerate(RECORDS, start=1)
        if (n := len(tiny_tokenizer.encode(r["question"], add_special_tokens=False))) > longest - 1
    ]
    assert over and all(
        f"{src}:{k} field 'question': {n} tokens, over the trainer's question budget of {longest - 1}" in err
        for k, n in over
    )


def test_help_explains_formats_fields_and_outputs(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["custom", "--help"])
    assert exit_.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    needles = ["--question-field", "--answers-field", "--context-field", "--documents-field", "save_to_disk"]
    needles += ["--eval-fraction", "eval_N.jsonl", "--lengths N", "one string (taken as the only answer)"]
    assert [n for n in needles if n not in text] == []


# -- data that would be silently wrong: repeats, ids, unnamed fields, a list stored as text ----------------


def test_repeated_records_and_ids_are_errors_naming_both_lines(tmp_path, capsys):
    records = [
        {"id": "q-1", "question": "Who?", "answers": ["A"], "context": "A did it."},
        {"id": "q-2", "question": "When?", "answers": ["1843"], "context": "In 1843."},
        {"id": "q-3", "question": "Who?", "answers": ["A"], "context": "A did it."},  # line 1 again, another id
        {"id": "q-2", "question": "Where?", "answers": ["Here"], "context": "Here it was."},  # line 2's id
    ]
    src = write_jsonl(tmp_path / "qa.jsonl", records)
    outputs = ["--train-out", tmp_path / "t.parquet", "--eval-out", tmp_path / "eval_1.jsonl"]
    code, out, err = run([src, "--eval-fraction", "0.5", *outputs], capsys)
    assert (code, out) == (2, "")
    hint = "; --duplicates keep-first keeps the first of each"
    assert err.splitlines() == [
        "error: 2 problem(s) in 2 of 4 records; nothing was written:",
        f"  {src}:3: the same question and context as {src}:1 (a duplicate){hint}",
        f"  {src}:4 field 'id': 'q-2' is also the id of {src}:2, the index of its eval item{hint}",
    ]
    # A record without an id is indexed by its position: an id equal to it would share its eval item's index.
    mixed = write_jsonl(tmp_path / "mixed.jsonl", [{**records[1], "id": None}, {**records[3], "id": 0}])
    code, _, err = run([mixed, "--eval-out", tmp_path / "eval_1.jsonl"], capsys)
    assert code == 2
    assert f"  {mixed}:2 field 'id': 0 is also the position of {mixed}:1, the index of its eval item{hint}" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mixed.jsonl", "qa.jsonl"]


def test_records_that_differ_by_white_space_at_the_ends_are_duplicates(tmp_path, capsys):
    records = [
        {"question": "Who?", "answers": ["A"], "context": "A did it."},
        {"question": "Who? ", "answers": ["A"], "context": "A did it."},  # a trailing space
        {"question": "Who?", "answers": ["A"], "context": "\nA did it.\t"},  # white space around the context
        {"question": "Who?", "answers": ["A"], "context": "A  did it."},  # inside: another text, not a duplicate
    ]
    src = write_jsonl(tmp_path / "qa.jsonl", records)
    code, out, err = run([src, "--eval-out", tmp_path / "eval_1.jsonl"], capsys)
    assert (code, out) == (2, "")
    hint = "; --duplicates keep-first keeps the first of each"
    assert err.splitlines() == [
        "error: 2 problem(s) in 2 of 4 records; nothing was written:",
        f"  {src}:2: the same question and context as {src}:1 (a duplicate){hint}",
        f"  {src}:3: the same question and context as {src}:1 (a duplicate){hint}",
    ]


def test_keep_first_drops_the_repeats_so_no_question_is_both_trained_and_evaluated(tmp_path, capsys):
    # 12 questions, each written twice (the second copy under another id): without the check, a held-out split
    # of the 24 records would put copies of one question on both sides.
    records = [
        {"id": 100 * copy + k, "question": f"q{k}?", "answers": [f"a{k}"], "context": f"c{k}"}
        for copy in (0, 1)
        for k in range(12)
    ]
    src = write_jsonl(tmp_path / "qa.jsonl", records)
    train, ev = tmp_path / "t.parquet", tmp_path / "ev" / "eval_1.jsonl"
    argv = [src, "--eval-fraction", "0.25", "--duplicates", "keep-first", "--train-out", train, "--eval-out", ev]
    code, out, err = run(argv, capsys)
    assert (code, err) == (0, "")
    trained = [r["prompt"][0]["content"] for r in parquet_rows(train)]
    evaluated = [json.loads(line)["input"] for line in ev.read_text().splitlines()]
    assert len(evaluated) == 3 and len(trained) == 9  # round(0.25 x 12 kept)
    assert sorted(trained + evaluated) == sorted(f"q{k}?" for k in range(12))  # each question once, one side
    assert "12 repeated record(s) dropped (--duplicates keep-first), the first kept:" in out
    assert f"  {src}:13: the same question and context as {src}:1 (a duplicate)" in out
    # the first copies are the ones kept: the eval items' indices are their ids, below 12
    assert all(json.loads(line)["index"] < 12 for line in ev.read_text().splitlines())


def test_the_id_is_the_eval_items_index_and_the_training_rows_id(tmp_path, capsys):
    records = [
        {"id": "5a8b57f2", "question": "Who?", "answers": ["A"], "context": "A did it."},
        {"question": "When?", "answers": ["1843"], "context": "In 1843."},  # no id: its position
        {"id": 77, "question": "Where?", "answers": ["Here"], "context": "Here it was."},
    ]
    src = write_jsonl(tmp_path / "qa.jsonl", records)
    train, ev = tmp_path / "t.parquet", tmp_path / "eval_1.jsonl"
    assert run([src, "--train-out", train, "--eval-out", ev], capsys)[0] == 0
    assert [json.loads(line)["index"] for line in ev.read_text().splitlines()] == ["5a8b57f2", 1, 77]
    extra = [r["extra_info"] for r in parquet_rows(train)]
    assert [(e["index"], e["id"]) for e in extra] == [(0, "5a8b57f2"), (1, None), (2, "77")]
    assert evalsets.scan(ev) == ["5a8b57f2", 1, 77]  # the harness reads them as the items' ids
    # another field may hold it; an id that is neither an integer nor text is an error
    renamed = write_jsonl(tmp_path / "r.jsonl", [{**records[0], "id": None, "key": 3.5}])
    code, _, err = run([renamed, "--id-field", "key", "--eval-out", tmp_path / "eval_2.jsonl"], capsys)
    assert code == 2 and f"{renamed}:1 field 'key': must be an integer or a non-empty string, got float 3.5" in err


def test_fields_no_option_names_are_listed(tmp_path, capsys):
    records = [
        {"question": "Who?", "answers": ["A"], "context": "A did it.", "title": "t", "meta": {"x": 1}},
        {"question": "When?", "answers": ["1843"], "context": "In 1843.", "title": "u"},
    ]
    src = write_jsonl(tmp_path / "qa.jsonl", records)
    code, out, _ = run([src, "--eval-out", tmp_path / "eval_1.jsonl"], capsys)
    assert code == 0
    assert "fields not written (no option names them): meta (1 records), title (2 records)" in out
    # a dotted field name uses its top-level field: nothing else is ignored
    squad = write_jsonl(tmp_path / "s.jsonl", [{"q": "Who?", "ans": {"text": ["A"], "start": [0]}, "ctx": "A."}])
    argv = [squad, "--question-field", "q", "--answers-field", "ans.text", "--context-field", "ctx"]
    code, out, _ = run([*argv, "--eval-out", tmp_path / "eval_2.jsonl"], capsys)
    assert code == 0 and "fields not written" not in out


def test_answers_that_are_the_text_of_a_list(tmp_path, capsys):
    # A table that stored a list as text: one literal answer would never be matched by a reply.
    rows = [
        {"question": "Where is the observatory?", "answers": "['Arecibo', 'Puerto Rico']", "context": "In Arecibo."},
        {"question": "Which year?", "answers": '["1843"]', "context": "In 1843."},
        {"question": "Which bracket?", "answers": "[citation needed]", "context": "A bracket."},  # not a list
    ]
    src = tmp_path / "qa.parquet"
    pq.write_table(pa.Table.from_pylist(rows), src)
    ev = tmp_path / "eval_1.jsonl"
    code, _, err = run([src, "--eval-out", ev], capsys)
    assert code == 2
    hint = "not one answer: --answer-lists parse reads it as that list, --answer-lists literal keeps it as one answer"
    assert err.splitlines()[1:] == [
        f"  {src}: row 0 field 'answers': the text of a list, \"['Arecibo', 'Puerto Rico']\", {hint}",
        f"  {src}: row 1 field 'answers': the text of a list, '[\"1843\"]', {hint}",
    ]
    assert run([src, "--eval-out", ev, "--answer-lists", "parse"], capsys)[0] == 0
    items = [json.loads(line) for line in ev.read_text().splitlines()]
    assert [scoring.golds(i) for i in items] == [["Arecibo", "Puerto Rico"], ["1843"], ["[citation needed]"]]
    assert run([src, "--eval-out", ev, "--answer-lists", "literal"], capsys)[0] == 0
    items = [json.loads(line) for line in ev.read_text().splitlines()]
    assert [scoring.golds(i) for i in items] == [[r["answers"]] for r in rows]


def test_answers_that_are_the_text_of_a_list_of_numbers(tmp_path, capsys):
    # "[1984]" was taken as one answer, the text "[1984]", which no reply matches; it is a list like '["1984"]'.
    rows = [
        {"question": "Which year?", "answers": "[1984]", "context": "In 1984."},
        {"question": "Which years?", "answers": "[1984, '1985']", "context": "In 1984 and 1985."},
        {"question": "Which flag?", "answers": "[True]", "context": "A flag."},  # not numbers: one answer
    ]
    src = tmp_path / "qa.parquet"
    pq.write_table(pa.Table.from_pylist(rows), src)
    ev = tmp_path / "eval_1.jsonl"
    code, _, err = run([src, "--eval-out", ev], capsys)
    hint = "not one answer: --answer-lists parse reads it as that list, --answer-lists literal keeps it as one answer"
    assert code == 2 and err.splitlines()[1:] == [
        f"  {src}: row 0 field 'answers': the text of a list, '[1984]', {hint}",
        f"  {src}: row 1 field 'answers': the text of a list, \"[1984, '1985']\", {hint}",
    ]
    assert run([src, "--eval-out", ev, "--answer-lists", "parse"], capsys)[0] == 0
    items = [json.loads(line) for line in ev.read_text().splitlines()]
    assert [scoring.golds(i) for i in items] == [["1984"], ["1984", "1985"], ["[True]"]]


# -- the README's worked example runs as written ------------------------------------------------------------


def test_the_readme_example_runs_as_written(tmp_path, capsys, monkeypatch):
    text = (REPO / "taskutils" / "memory_data" / "README.md").read_text()
    section = text.split("## Your own data")[1].split("\n## ")[0]
    jsonl = re.search(r"```json\n(.*?)```", section, re.S).group(1)
    command = re.search(r"(python -m taskutils\.memory_data custom .*?)\n(?!\s)", section, re.S).group(1)
    monkeypatch.chdir(tmp_path)
    Path("my_qa.jsonl").write_text(jsonl)
    argv = command.replace("\\\n", " ").split()[3:]
    assert main(argv) == 0
    out = capsys.readouterr().out
    for line in re.search(r"```text\n(.*?)```", section, re.S).group(1).splitlines():
        assert line in out, line


def test_a_context_without_white_space_is_counted_window_by_window(tmp_path, capsys, caplog, tiny_tokenizer):
    # 150,000 letters, no white space: one "word" for the tokenizer, once counted by encoding it whole (~190 bytes of
    # memory a character); now in windows, cut inside the word, to the same count.
    import logging
    import random

    letters = "".join(random.Random(3).choices("abcdefghijklmnopqrstuvwxyz", k=150_000))
    src = write_jsonl(tmp_path / "qa.jsonl", [{"question": "Which letter?", "answers": ["a"], "context": letters}])
    with caplog.at_level(logging.WARNING, logger="recurrent.tokens"):
        code, out, _ = run([src, "--tokenizer", "tiny", "--eval-out", tmp_path / "eval_1.jsonl"], capsys)
    assert code == 0 and caplog.text == ""  # no "encoding the whole text at once"
    count = len(tiny_tokenizer.encode(letters, add_special_tokens=False))
    assert f"context tokens: min {count:,}, median {count:,}, max {count:,}" in out
