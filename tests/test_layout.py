"""The distribution: our three packages import next to stock verl, and no copy of verl lives here."""

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
