"""The original's command where its users type it: `cd taskutils/memory_eval && python run.py ...` is the harness of
`python -m taskutils.memory_eval.run ...`. Run as a file, the folder's own modules (config.py, results.py, ...) are
not on sys.path: the repository root is, and the file runs as the package's module. Each command runs in a
subprocess whose working directory is a temporary copy of that folder alone."""

from __future__ import annotations

import pytest
from eval_fixtures import harness_argv, hotpotqa_set, read_lines, write_table
from process_helpers import run_in_folder_copy

FOLDER = "taskutils/memory_eval"


def test_run_py_prints_the_help_of_the_module(tmp_path):
    _, as_file = run_in_folder_copy(FOLDER, tmp_path / "a", "run.py", "--help")
    _, as_module = run_in_folder_copy(FOLDER, tmp_path / "b", "-m", "taskutils.memory_eval.run", "--help")
    assert as_file.returncode == 0 == as_module.returncode, as_file.stderr[-2000:]
    assert as_file.stdout == as_module.stdout
    assert (
        as_file.stdout.startswith("usage: python -m taskutils.memory_eval.run")
        and "--timeout-per-token" in as_file.stdout
    )


def _shadowing_yaml(folder) -> None:
    # A sibling named like a module the harness imports (PyYAML, by config.py): the file run must not import it.
    (folder / "yaml.py").write_text("raise ImportError('the folder of run.py was on sys.path')\n")


@pytest.mark.slow(seconds=20)
def test_a_tiny_run_through_run_py(tiny_server, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    hotpotqa_set(data, 2, items=2)
    table = write_table(tmp_path / "table.yaml", tiny_server)
    out = tmp_path / "results"
    argv = harness_argv(data, out, 2, "--table", str(table), "--models", "tiny", "--method", "memory,direct")
    folder, run = run_in_folder_copy(FOLDER, tmp_path / "cwd", "run.py", *argv, prepare=_shadowing_yaml)
    assert run.returncode == 0, run.stderr[-3000:]
    for method in ("memory", "direct"):
        lines = read_lines(out / "hotpotqa_2" / f"tiny__{method}.jsonl")
        assert sorted(r["id"] for r in lines) == [10, 11]  # the fixture's indices
        assert all(r["error"] is None and r["method"] == method for r in lines)
    assert not (folder / "results").exists() and not (folder / "__pycache__").exists()  # nothing written there
