"""Fixtures for the verl_ext tests: composed configs, the tiny model's tokenizer, a real tiny token server."""

from __future__ import annotations

import pytest
from omegaconf import DictConfig
from vx_helpers import TINY_BUDGETS, compose_config


@pytest.fixture(scope="session")
def tiny_config(tiny_model_dir) -> DictConfig:
    """tiny_cpu with small budgets and the model path resolved to the offline tiny model."""
    return compose_config("tiny_cpu", [*TINY_BUDGETS, f"actor_rollout_ref.model.path={tiny_model_dir}"])


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="session")
def tiny_server(tiny_model_dir, tiny_tokenizer):
    """A real token-in/token-out server around the tiny model, in this process."""
    from verl_ext.cpu.hf_server import HFTokenServer

    return HFTokenServer(tiny_model_dir, tiny_tokenizer)
