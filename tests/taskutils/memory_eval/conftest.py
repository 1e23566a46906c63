"""Shared fixtures of the evaluation-harness tests: small generated eval sets (the tiny model's server is
tests/conftest.py's ``tiny_server``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from eval_fixtures import hotpotqa_set, niah_set


@pytest.fixture(scope="session")
def eval_data(tmp_path_factory) -> Path:
    """HotpotQA-style sets at 2 and 4 documents, RULER-style niah_single_1 at 256 and 512 "tokens"; 4 items each."""
    folder = tmp_path_factory.mktemp("eval_data")
    for num_docs in (2, 4):
        hotpotqa_set(folder, num_docs)
    for length in (256, 512):
        niah_set(folder, length)
    return folder
