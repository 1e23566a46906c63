"""The README's "Coming from the original" table, row by row: every path it names here exists, and every command it
names here answers `--help` where the original's users type it (the working folder the row says)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SECTION = "## Coming from the original"


def table_rows() -> list[tuple[str, str]]:
    text = (REPO / "README.md").read_text().split(SECTION, 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 2 and cells[0] not in ("the original", "---"):
            rows.append((cells[0], cells[1]))
    return rows


def our_paths(cell: str) -> list[str]:
    """The repository paths a cell names (a file or folder of ours, by its extension or trailing slash; not a URL, a
    pattern, a variable or a folder that a run makes)."""
    return [
        code
        for code in re.findall(r"`([^`]+)`", cell)
        if " " not in code
        and ("/" in code or code.endswith((".py", ".sh")))
        and not code.startswith(("-", "data/", "results/", "memory_agent/"))  # folders that runs make
        and not any(mark in code for mark in ("://", "$", "{"))
    ]


def our_commands(cell: str) -> list[tuple[Path, list[str]]]:
    """The commands a cell names, as (working folder, argv up to the subcommand): `cd DIR && python FILE [STAGE]`,
    `python -m MODULE [STAGE]`, `bash FILE`."""
    commands = []
    for code in re.findall(r"`([^`]+)`", cell):
        folder = REPO
        if code.startswith("cd ") and " && " in code:
            where, code = code[3:].split(" && ", 1)
            folder = REPO / where
        argv = shlex.split(code)
        env = [a for a in argv if re.fullmatch(r"[A-Z_]+=\S*", a)]
        argv = argv[len(env) :]
        if argv[:1] == ["python"]:
            words = argv[1:3] if argv[1] == "-m" else argv[1:2]
            stage = [a for a in argv[1 + len(words) :][:1] if re.fullmatch(r"[a-z][a-z-]*", a)]
            commands.append((folder, [sys.executable, *words, *stage]))
        elif argv[:2] == ["hf", "download"]:  # the hub's own client, installed with our dependencies
            commands.append((folder, [str(Path(sys.executable).parent / "hf"), "download"]))
        elif argv[:1] == ["bash"] and argv[1].endswith(".sh"):
            commands.append((folder, ["bash", argv[1]]))
    return commands


def test_the_table_lists_every_path_of_the_original_readme():
    # The original's README names these paths and commands (its Testing, Training, Data and Engineering sections).
    original = " ".join(cell for cell, _ in table_rows())
    for named in (
        "taskutils/memory_data",
        "download_qa_dataset.sh",
        "hfd.sh",
        "processing.py",
        "filter.py",
        "filter2.py",
        "convert_to_eval.py",
        "different_docs_eval.py",
        "download_paulgraham_essay.py",
        "ruler_data_prepare.sh",
        "taskutils/memory_eval && python run.py",
        "SERVE_PORT",
        "run_memory_7B.sh",
        "run_memory_14B.sh",
        "recurrent/impls/memory.py",
        "recurrent/interface.py",
        "recurrent/generation_manager.py",
        "recurrent/impls/async_",
        "recurrent/async_generation_manager.py",
        "verl/workers/reward_manager/thread.py",
    ):
        assert named in original, named


@pytest.mark.parametrize(("original", "ours"), table_rows(), ids=[row[0][:40] for row in table_rows()])
def test_each_row_points_at_something_that_is_here(original, ours):
    paths, commands = our_paths(ours), our_commands(ours)
    assert paths or commands, ours
    for path in paths:
        assert (REPO / path.rstrip("/")).exists(), path
    for folder, argv in commands:
        if argv[0] == "bash":  # a training launcher: its DRY_RUN is tested with the launcher; here, that it is ours
            assert (folder / argv[1]).is_file(), argv
            continue
        env = {**os.environ, "PYTHONPATH": ""}  # as a user's shell: nothing of the test run's path
        result = subprocess.run([*argv, "--help"], cwd=folder, capture_output=True, text=True, env=env, timeout=300)
        assert result.returncode == 0, (folder, argv, result.stderr[-2000:])
        assert "usage:" in result.stdout.lower(), result.stdout[:500]
