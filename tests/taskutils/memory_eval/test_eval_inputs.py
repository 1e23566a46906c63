"""Eval-set files as users have them: the paper's released HotpotQA sets (JSON arrays; above 10,000 documents
the context is a list of indices into the pool of ``hotpotqa_dev.json``), and bad input, which must stop the run
before any model call with a message naming the file, the line and the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from eval_fixtures import harness_argv

from recurrent.local_server import free_port
from taskutils.memory_eval import evalsets
from taskutils.memory_eval.run import main as run_main

# A hand-made hotpotqa_dev.json. Its documents are title + "\n" + the sentences joined as they are:
#   "Beta\n b1. b2."  "Alpha\na1."  "Gamma\ng."  "Alpha\na1." (again)  "Alpha\na2."  "alpha\nx."
# The pool is their sorted set (code-point order: upper case before lower case):
#   0 "Alpha\na1."   1 "Alpha\na2."   2 "Beta\n b1. b2."   3 "Gamma\ng."   4 "alpha\nx."
DEV = [
    {"_id": "q0", "question": "Q0?", "answer": "A0", "context": [["Beta", [" b1.", " b2."]], ["Alpha", ["a1."]]]},
    {
        "_id": "q1",
        "question": "Q1?",
        "answer": "A1",
        "context": [["Gamma", ["g."]], ["Alpha", ["a1."]], ["Alpha", ["a2."]]],
    },
    {"_id": "q2", "question": "Q2?", "answer": "A2", "context": [["alpha", ["x."]]]},
]
RELEASED = [
    {"index": 7, "input": "Who is x?", "answers": ["x"], "num_docs": 3, "context": [4, 0, 2]},
    {"index": 9, "input": "Who is g?", "answers": ["g"], "num_docs": 2, "context": [3, 3]},
]
EXPECTED_TEXT = {
    7: "Document 1:\nalpha\nx.\n\nDocument 2:\nAlpha\na1.\n\nDocument 3:\nBeta\n b1. b2.",
    9: "Document 1:\nGamma\ng.\n\nDocument 2:\nGamma\ng.",
}


@pytest.fixture
def released(tmp_path) -> Path:
    data = tmp_path / "data"
    data.mkdir()
    (data / "hotpotqa_dev.json").write_text(json.dumps(DEV))
    (data / "eval_12800.json").write_text(json.dumps(RELEASED, indent=1))  # a JSON array, as released
    return data


def test_the_pool_is_the_sorted_set_of_documents(released):
    assert evalsets.document_pool(released / "hotpotqa_dev.json") == (
        "Alpha\na1.",
        "Alpha\na2.",
        "Beta\n b1. b2.",
        "Gamma\ng.",
        "alpha\nx.",
    )


@pytest.mark.parametrize("suffix", [".json", ".jsonl"])
def test_index_contexts_resolve_to_the_hand_written_text(released, suffix):
    path = released / f"eval_12800{suffix}"
    if suffix == ".jsonl":
        (released / "eval_12800.json").unlink()
        path.write_text("".join(json.dumps(item) + "\n" for item in RELEASED))
    assert evalsets.data_file(released, "hotpotqa", 12800) == path
    pool = evalsets.pool_file(released)
    assert evalsets.scan(path, pool=pool) == [7, 9]
    items = list(evalsets.iter_items(path, pool=pool))
    assert {item["index"]: item["context"] for item in items} == EXPECTED_TEXT
    assert [i["index"] for i in evalsets.iter_items(path, only={9}, pool=pool)] == [9]


def test_a_text_context_json_array_is_read_as_is(tmp_path):
    path = tmp_path / "eval_50.json"
    path.write_text(json.dumps([{"input": "q", "answers": ["a"], "context": "Document 1:\nT\ntext"}]))
    assert evalsets.scan(path) == [0]  # no index: the position
    assert [i["context"] for i in evalsets.iter_items(path)] == ["Document 1:\nT\ntext"]


def test_pool_found_under_sources_or_given(tmp_path, released):
    sources = tmp_path / "other" / "sources"
    sources.mkdir(parents=True)
    (released / "hotpotqa_dev.json").rename(sources / "hotpotqa_dev.json")
    assert evalsets.pool_file(tmp_path / "other") == sources / "hotpotqa_dev.json"
    assert evalsets.pool_file(released) is None
    assert evalsets.pool_file(released, "x.json") == Path("x.json")


def test_released_index_set_runs_end_to_end(released, tiny_server, tmp_path):
    """The released 12,800-document form through the harness: every item runs and has a result."""
    out = tmp_path / "results"
    server = ("--url", tiny_server.base_url, "--served-model", tiny_server.model)
    argv = harness_argv(released, out, 12800, "--models", "tiny", *server, "--max-retries", "0")
    assert run_main(argv) == 0
    lines = [json.loads(x) for x in (out / "hotpotqa_12800" / "tiny__memory.jsonl").read_text().splitlines()]
    assert sorted(r["id"] for r in lines) == [7, 9] and all(r["error"] is None for r in lines)
    assert {r["id"]: r["context_tokens"] > 0 for r in lines} == {7: True, 9: True}
    meta = json.loads((out / "hotpotqa_12800" / "tiny__memory.meta.json").read_text())
    assert meta["settings"]["sampling"] == {"temperature": 0.7, "top_p": 0.95}
    assert meta["sampling_applied"].startswith("not verified: an external endpoint (--url)")


# ---- bad input: exit 2 before any model call, the message names the place ----

GOOD = {"index": 0, "input": "q?", "context": "some text", "answers": ["a"]}


def _bad_run(tmp_path: Path, text: str | None, name: str = "eval_2.jsonl", extra: list[str] | None = None):
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    if text is not None:
        (data / name).write_text(text)
    out = tmp_path / "results"
    # A closed port: were any request sent, the run would fail with a connection error, not exit 2.
    argv = harness_argv(data, out, 2, "--models", "tiny", "--url", f"http://127.0.0.1:{free_port()}/v1", *(extra or []))
    code = run_main(argv)
    return code, data / name, out


def _lines(*items) -> str:
    return "".join((item if isinstance(item, str) else json.dumps(item)) + "\n" for item in items)


BAD_INPUTS = {
    "missing context": (
        _lines(GOOD, {"index": 1, "input": "q?", "answers": ["a"]}),
        ":2: field 'context' is missing; fields: answers, index, input",
    ),
    "missing question": (
        _lines(GOOD, GOOD | {"index": 1}, {"index": 2, "context": "c", "answers": ["a"]}),
        ":3: field 'input' (the question) is missing; fields: answers, context, index",
    ),
    "empty question": (_lines({**GOOD, "input": "  "}), ":1: field 'input' (the question) must be a non-empty"),
    "missing gold": (
        _lines({"index": 0, "input": "q", "context": "c", "answer": "a"}),
        ":1: no gold answers: neither 'answers' nor 'outputs'; fields: answer, context, index, input",
    ),
    "empty gold": (_lines({**GOOD, "answers": []}), ":1: field 'answers' must be a non-empty list of strings, got []"),
    "malformed line": (
        _lines(GOOD, "", '{"index": 1, "input": "q", "context": "c" "answers": ["a"]}'),
        # column 43: the quote that opens "answers" (13 + 14 + 15 characters before it)
        ':3:43: not valid JSON (Expecting \',\' delimiter): \'{"index": 1, "input": "q", "context": "c" "answers"',
    ),
    "not an object": (_lines(GOOD, "[1, 2]"), ":2: an item must be a JSON object, got [1, 2]"),
    "duplicate index": (_lines(GOOD, GOOD), ":2: duplicate item index 0 (first at "),
    "empty file": ("\n", ": no items (the file is empty)"),
    "context of another type": (_lines({**GOOD, "context": 5}), ":1: field 'context' must be text or a list"),
    "index context without pool": (
        _lines({**GOOD, "context": [0, 1]}),
        ":1: field 'context' lists document indices, which need hotpotqa_dev.json",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_stops_before_any_model_call(tmp_path, capsys, case):
    text, expected = BAD_INPUTS[case]
    code, path, out = _bad_run(tmp_path, text)
    err = capsys.readouterr().err
    assert code == 2
    assert f"error: {path}{expected}" in err
    assert not list(out.glob("*/*.jsonl"))  # nothing ran


def test_bad_json_array_names_line_and_column(tmp_path, capsys):
    code, path, _ = _bad_run(tmp_path, '[\n  {"input": "q",\n   "context": }\n]', name="eval_2.json")
    assert code == 2 and f"error: {path}:3:15: not valid JSON (Expecting value)" in capsys.readouterr().err


def test_bad_item_of_a_json_array_names_its_position(tmp_path, capsys):
    code, path, _ = _bad_run(tmp_path, json.dumps([GOOD, {"input": "q", "answers": ["a"]}]), name="eval_2.json")
    assert code == 2 and f"error: {path}: item 1: field 'context' is missing" in capsys.readouterr().err


def test_index_out_of_the_pool_is_named(tmp_path, capsys):
    (tmp_path / "dev.json").write_text(json.dumps(DEV))
    text = _lines({**GOOD, "context": [4, 5]})
    code, path, _ = _bad_run(tmp_path, text, extra=["--hotpotqa-dev", str(tmp_path / "dev.json")])
    expected = f"error: {path}:1: field 'context'[1] = 5 is not a document index of the pool (0 ... 4)"
    assert code == 2 and expected in capsys.readouterr().err


def test_a_selection_without_data_is_an_error(tmp_path, capsys):
    code, _, out = _bad_run(tmp_path, None)
    err = capsys.readouterr().err
    assert code == 2
    data = tmp_path / "data"
    assert f"error: no eval set for the selected task(s) hotpotqa: looked for {data}/eval_2.jsonl or eval_2.json" in err
    assert "--tasks / --lengths" in err and not list(out.glob("*/*"))


def test_a_length_without_data_is_an_error(tmp_path, capsys):
    code, _, out = _bad_run(tmp_path, _lines(GOOD), extra=["--lengths", "2,3"])
    err = capsys.readouterr().err
    assert code == 2 and "error: no eval set for the selected length(s) 3: looked for " in err
    assert not list(out.glob("*/*"))


def test_an_oversize_question_is_reported_before_its_item_runs(tmp_path, caplog):
    long_question = "Which of these is the river? " + "river stone garden " * 600
    text = _lines(GOOD, {**GOOD, "index": 1, "input": long_question})
    code, path, out = _bad_run(tmp_path, text, extra=["--max-retries", "0"])
    assert code == 1  # the closed port: its check fails before any item, and the run says so
    messages = [r.getMessage() for r in caplog.records]
    warned = next(i for i, m in enumerate(messages) if "over the 1024-token question budget" in m)
    assert messages[warned].startswith(f"{path}:2: the question has ")  # file and line of the item
    assert "it is kept whole" in messages[warned]
    first_failure = next(i for i, m in enumerate(messages) if "failed" in m)
    assert warned < first_failure  # reported before any item ran
    assert sum("question budget" in m for m in messages) == 1  # the short question is not reported
