"""`python -m taskutils.memory_data` with counts that cannot work (issue 20, item 3): exit 2 with a message naming
the option or the source file, before anything is written; no traceback."""

from __future__ import annotations

import pytest

from taskutils.memory_data.run import main


def _eval_argv(sources, out, *options: str) -> list[str]:
    return ["hotpotqa-eval", "--out", str(out), "--sources", str(sources["hotpotqa_dev"].parent), *options]


def test_first_beyond_the_dev_file_names_it(sources, tmp_path, capsys):
    # The fixture's dev file has 40 questions: --first 41 asks for index 40, one too many.
    assert main(_eval_argv(sources, tmp_path, "--first", "41", "--num-docs", "20")) == 2
    err = capsys.readouterr().err
    assert f"error: {sources['hotpotqa_dev']} has 40 questions; indices [40] are out of range" in err
    assert "--first N: N at most 40" in err
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_fewer_documents_than_a_question_owns_is_refused_before_writing(sources, tmp_path, capsys):
    # Every fixture question has 10 paragraphs of its own (2 gold, 7 distractors, 1 shared).
    assert main(_eval_argv(sources, tmp_path, "--first", "2", "--num-docs", "20", "5")) == 2
    err = capsys.readouterr().err
    expected = f"error: 5 documents per sample: question 0 of {sources['hotpotqa_dev']} has 10 documents of its own"
    assert expected in err and "use at least 10" in err
    assert list(tmp_path.iterdir()) == []  # checked for every count before the first file: not even eval_20


@pytest.mark.parametrize(
    ("command", "option", "value"),
    [
        ("hotpotqa-eval", "--num-docs", "-5"),
        ("hotpotqa-eval", "--num-docs", "0"),
        ("hotpotqa-eval", "--first", "0"),
        ("hotpotqa-process", "--num-docs", "-1"),
        ("hotpotqa-process", "--dev-samples", "0"),
        ("hotpotqa-process", "--workers", "0"),
        ("ruler", "--lengths", "-8192"),
        ("ruler", "--num-samples", "0"),
        ("hotpotqa-filter", "--concurrency", "0"),
    ],
)
def test_a_non_positive_count_is_refused_by_its_option(tmp_path, capsys, command, option, value):
    with pytest.raises(SystemExit) as stop:
        main([command, "--out", str(tmp_path), option, value])
    assert stop.value.code == 2
    assert f"error: argument {option}: must be a positive integer, got {value}" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
