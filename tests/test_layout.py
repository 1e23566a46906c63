"""The distribution: our three packages import next to stock verl, no copy of verl lives here, and `recurrent`
imports nothing above it."""

import ast
import importlib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_packages_import_with_stock_verl():
    verl = importlib.import_module("verl")
    assert verl.__version__ == "0.9.1"
    assert "site-packages" in verl.__file__  # the installed package, not a vendored copy
    for name in ("recurrent", "verl_ext", "taskutils"):
        module = importlib.import_module(name)
        assert Path(module.__file__).parent == REPO / name


def test_no_vendored_verl():
    skip = {".venv", ".git", ".cache"}
    vendored = [p for p in REPO.rglob("verl") if p.is_dir() and not skip & set(p.relative_to(REPO).parts)]
    assert vendored == []


def test_recurrent_imports_nothing_above_it():
    # recurrent/ is the framework verl_ext/ and taskutils/ build on: it imports neither of them, nor verl.
    above = {"verl", "verl_ext", "taskutils"}
    offenders = []
    for path in sorted((REPO / "recurrent").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            offenders += [f"{path.relative_to(REPO)}: {name}" for name in names if name.split(".")[0] in above]
    assert offenders == []
