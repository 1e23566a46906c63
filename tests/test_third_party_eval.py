"""scripts/third_party_eval.py: the per-item comparison of lm-eval's answers (through our endpoint) with our
harness's, read from files in the two harnesses' formats, written here by hand; and the whole script, run for real
at toy size (tiny model, two items)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

import third_party_eval as tpe  # noqa: E402  (scripts/ is not a package)


def lm_eval_sample(doc_id: int, index, answer: str) -> dict:
    """One line of lm-eval 0.4.13's ``--log_samples`` file for a generation task (the fields it writes)."""
    return {
        "doc_id": doc_id,
        "doc": {"index": index, "input": "What is the number?", "context": "...", "outputs": ["42"]},
        "target": "42",
        "arguments": {"gen_args_0": {"arg_0": ['[{"role": "user", "content": "..."}]'], "arg_1": {}}},
        "resps": [[answer]],
        "filtered_resps": [answer],
        "filter": "none",
        "metrics": ["exact_match"],
        "doc_hash": "0" * 64,
        "prompt_hash": "1" * 64,
        "target_hash": "2" * 64,
        "exact_match": 0.0,
    }


def harness_line(item_id, response: str | None, gold: list[str], error: str | None = None) -> dict:
    """One line of our harness's results file (the fields the comparison reads, and some it does not)."""
    return {"id": item_id, "task": "niah_single_1", "gold": gold, "response": response, "error": error, "turns": 3}


def write_lines(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_equal_answers_item_by_item(tmp_path):
    samples = write_lines(
        tmp_path / "samples.jsonl",
        [lm_eval_sample(1, 7, "Therefore, the answer is 42."), lm_eval_sample(0, 3, "The number is 9.")],
    )
    results = write_lines(
        tmp_path / "results.jsonl",
        [harness_line(3, "The number is 9.", ["9"]), harness_line(7, "Therefore, the answer is 42.", ["42"])],
    )
    rows = tpe.compare(tpe.lm_eval_answers(samples), tpe.harness_answers(results))
    assert [(r.id, r.equal) for r in rows] == [(3, True), (7, True)]  # our harness's order, matched by index
    assert rows[0].gold == ["9"]
    text = tpe.render_markdown(rows)
    assert text.splitlines()[-1] == "2 of 2 items: equal answers."
    assert "| 3 | 9 | `The number is 9.` | `The number is 9.` | yes |" in text


def test_differences_missing_and_failed_items_are_not_equal(tmp_path):
    samples = write_lines(
        tmp_path / "samples.jsonl",
        [
            lm_eval_sample(0, 0, "42\n"),  # a trailing newline more than ours
            lm_eval_sample(1, 1, "Therefore, the answer is 5."),  # our harness failed on this one
            lm_eval_sample(2, 9, "only lm-eval has it"),
        ],
    )
    results = write_lines(
        tmp_path / "results.jsonl",
        [
            harness_line(0, "42", ["42"]),
            harness_line(1, None, ["5"], error="ChatRequestError: HTTP 500"),
            harness_line(2, "lm-eval never asked", ["x"]),
        ],
    )
    rows = tpe.compare(tpe.lm_eval_answers(samples), tpe.harness_answers(results))
    assert [(r.id, r.third_party, r.ours, r.equal) for r in rows] == [
        (0, "42\n", "42", False),
        (1, "Therefore, the answer is 5.", None, False),
        (2, None, "lm-eval never asked", False),
        (9, "only lm-eval has it", None, False),
    ]
    text = tpe.render_markdown(rows)
    assert "| 0 | 42 | `42\\n` | `42` | **no** |" in text  # the newline shows, escaped
    assert "| 2 | x | (missing) | `lm-eval never asked` | **no** |" in text
    assert text.splitlines()[-1] == "0 of 4 items: equal answers."


def test_string_ids_and_table_characters(tmp_path):
    samples = write_lines(tmp_path / "s.jsonl", [lm_eval_sample(0, "q-1", "a | b `c`")])
    results = write_lines(tmp_path / "r.jsonl", [harness_line("q-1", "a | b `c`", ["a"])])
    rows = tpe.compare(tpe.lm_eval_answers(samples), tpe.harness_answers(results))
    assert rows[0].equal
    assert "| q-1 | a | `a \\| b 'c'` | `a \\| b 'c'` | yes |" in tpe.render_markdown(rows)


def test_an_item_twice_in_lm_evals_samples_is_refused(tmp_path):
    samples = write_lines(tmp_path / "s.jsonl", [lm_eval_sample(0, 4, "a"), lm_eval_sample(1, 4, "b")])
    with pytest.raises(ValueError, match="s.jsonl:2: item 4 appears twice"):
        tpe.lm_eval_answers(samples)


@pytest.mark.slow(seconds=40)  # ~30 s CPU (lm-eval start-up, three servers); 34-110 s on the shared cores
def test_lm_eval_through_the_endpoint_answers_as_our_harness(tmp_path):
    """The whole script at toy size: the tiny model (greedy), two RULER needle items of 512 tokens, 128-token
    chunks. lm-eval, unmodified, sends each item as one chat request to our endpoint; our harness runs the same
    items in process against the same upstream; every answer is the same string."""
    import subprocess

    work = tmp_path / "work"
    argv = ["--model", "tiny", "--length", "512", "--items", "2", "--chunk", "128", "--max-new", "16"]
    argv += ["--final-max-new", "16", "--work", str(work)]
    run = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "third_party_eval.py"), *argv],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    summary = json.loads((work / "comparison.json").read_text())
    assert [(item["id"], item["equal"]) for item in summary["items"]] == [(0, True), (1, True)]
    assert all(item["third_party"] for item in summary["items"])  # a real (non-empty) answer, not two Nones
    data = [json.loads(line) for line in (work / "data" / "eval_niah_single_1_512.jsonl").read_text().splitlines()]
    assert [item["gold"] for item in summary["items"]] == [d["outputs"] for d in data]
    # What lm-eval sent for the first item: one user message, the document, a blank line, the question.
    (samples,) = (work / "lm_eval").rglob("samples_memagent_niah_single_1_*.jsonl")
    (sent,) = json.loads(samples.read_text().splitlines()[0])["arguments"]["gen_args_0"]["arg_0"]
    assert json.loads(sent) == [{"role": "user", "content": f"{data[0]['context']}\n\n{data[0]['input']}"}]
    assert "2 of 2 items: equal answers." in run.stdout
