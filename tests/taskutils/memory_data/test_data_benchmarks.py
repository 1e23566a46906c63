"""The longbench and babilong stages on small files written here in the published formats (THUDM/LongBench's
data/{subset}.jsonl lines, RMT-team/babilong's data/qa{N}/{config}.json arrays), and their bad files named by file,
line and field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from taskutils.memory_data.run import main

# Records as published: every field of the format, the answers a list (several for one item), ids as published.
LONGBENCH = [
    {
        "input": "Which country is Paris in?",
        "context": "Passage 1:\nParis is the capital of France.",
        "answers": ["France"],
        "length": 7,
        "dataset": "hotpotqa",
        "language": "en",
        "all_classes": None,
        "_id": "a1b2",
    },
    {
        "input": "Who wrote Hamlet?",
        "context": "Passage 1:\nHamlet is a tragedy by William Shakespeare.",
        "answers": ["William Shakespeare", "Shakespeare"],
        "length": 9,
        "dataset": "hotpotqa",
        "language": "en",
        "all_classes": None,
        "_id": "c3d4",
    },
]
BABILONG = [
    {"input": "Mary went to the kitchen. John went to the garden.", "question": "Where is Mary?", "target": "kitchen"},
    {"input": "Daniel moved to the office.", "question": "Where is Daniel?", "target": "office"},
]


def write_sources(tmp_path: Path, longbench: str | None = None, babilong: str | None = None) -> Path:
    sources = tmp_path / "sources"
    (sources / "longbench").mkdir(parents=True)
    (sources / "babilong" / "qa2").mkdir(parents=True)
    lines = "".join(json.dumps(r) + "\n" for r in LONGBENCH)
    (sources / "longbench" / "hotpotqa.jsonl").write_text(longbench if longbench is not None else lines)
    (sources / "babilong" / "qa2" / "1k.json").write_text(babilong or json.dumps(BABILONG, indent=2))
    return sources


def read_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_published_files_become_eval_sets(tmp_path, capsys):
    sources = write_sources(tmp_path)
    out = tmp_path / "data"
    common = ["--out", str(out), "--sources", str(sources)]
    assert main(["longbench", "--subsets", "hotpotqa", *common]) == 0
    assert main(["babilong", "--tasks", "qa2", "--configs", "1k", *common]) == 0
    longbench = read_lines(out / "eval_longbench_hotpotqa_0.jsonl")
    assert [(i["index"], i["input"], i["context"], i["answers"], i["_id"]) for i in longbench] == [
        (0, "Which country is Paris in?", "Passage 1:\nParis is the capital of France.", ["France"], "a1b2"),
        (1, "Who wrote Hamlet?", LONGBENCH[1]["context"], ["William Shakespeare", "Shakespeare"], "c3d4"),
    ]
    # BABILong's `input` is the document; the harness's `input` is the question; the one target is the gold list.
    babilong = read_lines(out / "eval_babilong_qa2_1.jsonl")
    assert [(i["index"], i["input"], i["context"], i["answers"], i["config"]) for i in babilong] == [
        (0, "Where is Mary?", "Mary went to the kitchen. John went to the garden.", ["kitchen"], "1k"),
        (1, "Where is Daniel?", "Daniel moved to the office.", ["office"], "1k"),
    ]
    # JSON lines of the same records read the same (the datasets json builder takes both forms)
    (sources / "babilong" / "qa2" / "1k.json").write_text("".join(json.dumps(r) + "\n" for r in BABILONG))
    assert (
        main(
            ["babilong", "--tasks", "qa2", "--configs", "1k", "--out", str(tmp_path / "d2"), "--sources", str(sources)]
        )
        == 0
    )
    assert read_lines(tmp_path / "d2" / "eval_babilong_qa2_1.jsonl") == babilong


def test_the_harness_reads_them_as_its_tasks(tmp_path):
    from taskutils.memory_eval import config, evalsets

    sources = write_sources(tmp_path)
    out = tmp_path / "data"
    assert main(["longbench", "--subsets", "hotpotqa", "--out", str(out), "--sources", str(sources)]) == 0
    path = evalsets.data_file(out, "longbench_hotpotqa", 0)
    assert path == out / "eval_longbench_hotpotqa_0.jsonl"
    assert evalsets.scan(path) == [0, 1]
    assert config.expand_tasks(["longbench_qa"]) == [f"longbench_{s}" for s in config.LONGBENCH_QA_SUBSETS]
    assert config.expand_tasks(["babilong"]) == [
        "babilong_qa1",
        "babilong_qa2",
        "babilong_qa3",
        "babilong_qa4",
        "babilong_qa5",
    ]
    entry = config.ModelEntry(name="m", checkpoint="m")
    assert config.plan(entry, ["longbench_musique"], None) == [("longbench_musique", 0)]
    lengths = [n for _, n in config.plan(entry, ["babilong_qa3"], None)]
    assert lengths == [0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1000]  # 0k ... 512k, 1M


BAD_LONGBENCH = [
    (
        '{"input": "q", "context": "c", "answers": ["a"], "dataset": "hotpotqa", "_id": "x"}\n'
        '{"input": "q2", "context": "c2", "answers": "a2", "dataset": "hotpotqa", "_id": "y"}\n',
        ":2: field 'answers' must be a non-empty list of strings, got 'a2'",
    ),
    (
        '{"input": "q", "answers": ["a"], "dataset": "hotpotqa"}\n',
        ":1: field 'context' is missing; fields: answers, dataset, input",
    ),
    (
        '{"input": "", "context": "c", "answers": ["a"]}\n',
        ":1: field 'input' must be a non-empty string, got ''; fields: answers, context, input",
    ),
    (
        '{"input": "q", "context": "c", "answers": ["a"], "dataset": "musique"}\n',
        ":1: field 'dataset' is 'musique', not 'hotpotqa': another subset's file?",
    ),
    ('{"input": "q", "context": "c", "answers": ["a"]}\n{"input": \n', ":2:11: not valid JSON (Expecting value)"),
    ("", ": no records"),
]


@pytest.mark.parametrize(("text", "message"), BAD_LONGBENCH)
def test_a_bad_longbench_file_is_named_by_file_line_and_field(tmp_path, capsys, text, message):
    sources = write_sources(tmp_path, longbench=text)
    out = tmp_path / "data"
    assert main(["longbench", "--subsets", "hotpotqa", "--out", str(out), "--sources", str(sources)]) == 2
    err = capsys.readouterr().err
    assert err == f"error: {sources / 'longbench' / 'hotpotqa.jsonl'}{message}\n"
    assert not (out / "eval_longbench_hotpotqa_0.jsonl").exists()  # nothing written


BAD_BABILONG = [
    (
        '[\n  {"input": "a", "question": "Where?", "target": "x"},\n  {"input": "b", "question": "Where?"}\n]\n',
        ":3: field 'target' is missing; fields: input, question",
    ),
    (
        '[\n  {"input": "a", "question": "Where?", "target": ""}\n]',
        ":2: field 'target' must be a non-empty string, got ''; fields: input, question, target",
    ),
    (
        '[\n  {"input": "a", "question": "Where?", "target": "x"}\n  {"input": "b"}\n]',
        ":3: not valid JSON (expected ',' or ']' after an item)",
    ),
    (
        '[\n  {"input": "a", "question": "Where?", "target": "x"},\n',
        ": not valid JSON: the array is not closed (is the download incomplete?)",
    ),
    ('[\n  ["a", "b"]\n]', ":2: a record must be a JSON object, got ['a', 'b']"),
]


@pytest.mark.parametrize(("text", "message"), BAD_BABILONG)
def test_a_bad_babilong_file_is_named_by_file_line_and_field(tmp_path, capsys, text, message):
    sources = write_sources(tmp_path, babilong=text)
    args = ["babilong", "--tasks", "qa2", "--configs", "1k", "--out", str(tmp_path / "data"), "--sources", str(sources)]
    assert main(args) == 2
    assert capsys.readouterr().err == f"error: {sources / 'babilong' / 'qa2' / '1k.json'}{message}\n"


def test_an_empty_document_is_a_record_of_the_0k_config_only(tmp_path, capsys):
    record = [{"input": "", "question": "Where is Mary?", "target": "kitchen"}]
    sources = write_sources(tmp_path, babilong=json.dumps(record))
    zero = sources / "babilong" / "qa2" / "0k.json"
    zero.write_text(json.dumps(record))
    out = ["--out", str(tmp_path / "data"), "--sources", str(sources)]
    assert main(["babilong", "--tasks", "qa2", "--configs", "0k", *out]) == 0
    assert main(["babilong", "--tasks", "qa2", "--configs", "1k", *out]) == 2
    assert "1k.json:1: field 'input' must be a non-empty string, got ''" in capsys.readouterr().err
