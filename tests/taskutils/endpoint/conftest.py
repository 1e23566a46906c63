"""Fixtures of the server tests: the tiny model's tokenizer and a scripted upstream per test (the upstream of the
tests that need a model is tests/conftest.py's ``tiny_server``)."""

from __future__ import annotations

import pytest
from serve_helpers import ScriptedUpstream

from recurrent.models import load_tokenizer


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_dir):
    return load_tokenizer(tiny_model_dir)


@pytest.fixture
def scripted():
    """A scripted upstream on a free port, for the test's length."""
    with ScriptedUpstream().running() as upstream:
        yield upstream
