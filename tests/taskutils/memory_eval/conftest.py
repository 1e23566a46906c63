"""Shared fixtures of the evaluation-harness tests: one real `transformers serve` with the tiny model for the
whole session, and small generated eval sets."""

from __future__ import annotations

from pathlib import Path

import pytest
from eval_fixtures import hotpotqa_set, niah_set

from recurrent.local_server import transformers_serve


@pytest.fixture(scope="session")
def tiny_server(tiny_model_dir):
    """A real `transformers serve` with the tiny model (server.base_url, server.model)."""
    with transformers_serve(tiny_model_dir) as server:
        yield server


@pytest.fixture(scope="session")
def eval_data(tmp_path_factory) -> Path:
    """HotpotQA-style sets at 2 and 4 documents, RULER-style niah_single_1 at 256 and 512 "tokens"; 4 items each."""
    folder = tmp_path_factory.mktemp("eval_data")
    for num_docs in (2, 4):
        hotpotqa_set(folder, num_docs)
    for length in (256, 512):
        niah_set(folder, length)
    return folder
