"""The original's place of the data stages: `cd taskutils/memory_data && python run.py STAGE ...` is the command of
`python -m taskutils.memory_data STAGE ...`. Run as a file, the folder's own modules (tokenizer.py, parallel.py, ...)
are not on sys.path: the repository root is, and the file runs as the package's module. Each command runs in a
subprocess whose working directory is a temporary copy of that folder alone."""

from __future__ import annotations

import json

import pytest
from process_helpers import run_in_folder_copy

FOLDER = "taskutils/memory_data"


@pytest.mark.parametrize("stage", [[], ["ruler"], ["custom"]])
def test_run_py_prints_the_help_of_the_module(tmp_path, stage):
    _, as_file = run_in_folder_copy(FOLDER, tmp_path / "a", "run.py", *stage, "--help")
    _, as_module = run_in_folder_copy(FOLDER, tmp_path / "b", "-m", "taskutils.memory_data", *stage, "--help")
    assert as_file.returncode == 0 == as_module.returncode, as_file.stderr[-2000:]
    assert as_file.stdout == as_module.stdout
    assert as_file.stdout.startswith(" ".join(["usage: python -m taskutils.memory_data", *stage]))


def test_a_stage_runs_through_run_py(tmp_path):
    records = [
        {"question": "Who wrote the notes?", "answers": ["Ada Lovelace"], "context": "Ada Lovelace wrote the notes."},
        {"question": "When?", "answers": "1843", "context": "They appeared in 1843."},
    ]
    source = tmp_path / "qa.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in records))
    eval_set = tmp_path / "eval" / "eval_1.jsonl"

    def shadow_yaml(folder):  # a sibling named like a module the stages import: the file run must not import it
        (folder / "yaml.py").write_text("raise ImportError('the folder of run.py was on sys.path')\n")

    argv = ["run.py", "custom", str(source), "--eval-out", str(eval_set)]
    folder, run = run_in_folder_copy(FOLDER, tmp_path / "cwd", *argv, prepare=shadow_yaml)
    assert run.returncode == 0, run.stderr[-3000:]
    items = [json.loads(line) for line in eval_set.read_text().splitlines()]
    assert [(i["input"], i["context"], i["answers"]) for i in items] == [
        ("Who wrote the notes?", "Ada Lovelace wrote the notes.", ["Ada Lovelace"]),
        ("When?", "They appeared in 1843.", ["1843"]),
    ]
    assert not (folder / "data").exists()  # nothing written in the working directory
