"""Fixtures of the server tests: one real `transformers serve` with the tiny model for the session (the upstream
of the tests that need a model), its tokenizer, and a scripted upstream per test."""

from __future__ import annotations

import pytest
from serve_helpers import ScriptedUpstream

from recurrent.local_server import transformers_serve
from recurrent.models import load_tokenizer


@pytest.fixture(scope="session")
def tiny_upstream(tiny_model_dir):
    """A real `transformers serve` with the tiny model (base_url, model: the name requests use)."""
    with transformers_serve(tiny_model_dir) as server:
        yield server


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_dir):
    return load_tokenizer(tiny_model_dir)


@pytest.fixture
def scripted():
    """A scripted upstream on a free port, for the test's length."""
    with ScriptedUpstream().running() as upstream:
        yield upstream
