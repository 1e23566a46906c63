"""The recall probe's rows, chance and curve (experiments/needle/recall_probe.py)."""

from __future__ import annotations

import json
import random

import pytest

from experiments.needle.needle import NEEDLE_RE
from experiments.needle.reader import build_tokenizer
from experiments.needle.recall_probe import chance, main, recall_rows


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def test_a_bare_row_is_the_document_and_question_then_the_asked_number(tokenizer) -> None:
    rows, needles = recall_rows(tokenizer, random.Random(3), 6, "validation")
    assert needles == [2, 3, 4, 2, 3, 4]  # 1-3 other needles in turn, and the asked one
    for prompt, target in rows:
        text = tokenizer.decode(prompt)
        question = text.split("\n")[-2]
        key = question.split("magic number for ")[1].split(" ")[0]
        found = dict(NEEDLE_RE.findall(text.split("\n")[0]))  # key -> number, read off the document itself
        assert text.endswith("\nanswer:") and key in found
        assert target[-1] == tokenizer.eos_token_id
        assert tokenizer.decode(target[:-1]) == " " + found[key]


def test_a_paper_row_asks_in_the_memory_prompt_and_a_sentence_target_is_the_asked_needle(tokenizer) -> None:
    rows, _ = recall_rows(tokenizer, random.Random(4), 3, "train", target="sentence", prompt="paper")
    for prompt, target in rows:
        text = tokenizer.decode(prompt)
        assert (
            "<problem>" in text
            and "No previous memory" in text
            and text.endswith("Updated memory:\n<|im_end|>\n<|im_start|>assistant\n")
        )
        key = text.split("magic number for ")[1].split(" ")[0]  # the problem comes before the section
        sentence = tokenizer.decode(target[:-1])
        assert NEEDLE_RE.fullmatch(sentence).group(1) == key and sentence in text


def test_chance_is_the_mean_of_one_over_the_needles() -> None:
    assert chance([2, 3, 4]) == pytest.approx((1 / 2 + 1 / 3 + 1 / 4) / 3)
    assert chance([2, 2]) == 0.5


def test_a_fresh_tiny_reader_writes_a_curve_line_per_evaluation(tmp_path) -> None:
    out = tmp_path / "curve.jsonl"
    main(
        [
            "--out",
            str(out),
            "--fresh",
            "--hidden",
            "32",
            "--layers",
            "1",
            "--synth-steps",
            "2",
            "--steps",
            "4",
            "--eval-every",
            "2",
        ]
    )
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line["step"] for line in lines] == [0, 2, 4]
    assert lines[0]["chance"] == pytest.approx(chance([2, 3, 4] * 100), abs=1e-3)
    assert all(0 <= line["exact"] <= 1 for line in lines)


def test_the_probe_scores_validation_documents_and_trains_on_train_documents(tokenizer, tmp_path, monkeypatch) -> None:
    """The held-out rows' keys are the validation split's, the training rows' the train split's: read off the
    rows' text, not off the arguments (the splits' keys are disjoint: experiments/needle/needle.py)."""
    from experiments.needle import recall_probe
    from experiments.needle.needle import split_keys

    scored, trained = [], []
    monkeypatch.setattr(recall_probe, "teacher_forced", lambda model, rows, pad: scored.extend(rows) or {"exact": 0.0})
    monkeypatch.setattr(recall_probe, "sft_steps", lambda model, sample, *args: trained.extend(sample(4)))
    recall_probe.probe(None, tokenizer, 1, tmp_path / "curve.jsonl", held_docs=5)

    def keys(rows) -> set[str]:
        return {tokenizer.decode(prompt).split("magic number for ")[-1].split(" ")[0] for prompt, _ in rows}

    assert len(scored) == 5 and len(trained) == 4
    assert keys(scored) <= set(split_keys("validation")) and keys(trained) <= set(split_keys("train"))


def test_distractors_bounds_the_other_needles_of_every_row(tokenizer) -> None:
    """``distractors`` 1: every document holds the asked needle and one other, counted in the text itself."""
    rows, needles = recall_rows(tokenizer, random.Random(5), 4, "validation", distractors=1)
    assert needles == [2, 2, 2, 2]
    assert [len(NEEDLE_RE.findall(tokenizer.decode(prompt))) for prompt, _ in rows] == [2, 2, 2, 2]
    _, needles = recall_rows(tokenizer, random.Random(5), 4, "validation", distractors=2)
    assert needles == [2, 3, 2, 3]


def test_the_probe_records_its_distractors_and_their_chance(tokenizer, tmp_path, monkeypatch) -> None:
    from experiments.needle import recall_probe

    monkeypatch.setattr(recall_probe, "teacher_forced", lambda model, rows, pad: {"exact": 0.0})
    monkeypatch.setattr(recall_probe, "sft_steps", lambda *args: None)
    curve = recall_probe.probe(None, tokenizer, 1, tmp_path / "curve.jsonl", held_docs=6, distractors=1)
    assert curve[0]["distractors"] == 1 and curve[0]["chance"] == 0.5  # two needles: one in two


def test_the_probe_refuses_a_choice_without_another_needle(tmp_path, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--out", str(tmp_path / "c.jsonl"), "--distractors", "0"])
    assert exit_info.value.code == 2
    assert "--distractors 0" in capsys.readouterr().err
    assert not (tmp_path / "c.jsonl").exists()
