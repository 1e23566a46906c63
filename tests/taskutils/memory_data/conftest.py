"""Fixtures of the data-pipeline tests: source files in the real formats, and the tiny tokenizer."""

import pytest
from memory_data_fixtures import write_sources


@pytest.fixture(scope="session")
def sources(tmp_path_factory):
    return write_sources(tmp_path_factory.mktemp("sources"))


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)
