"""The actor's attention follows flash-attn's presence (verl_ext/attention.py): packed rows only with
flash-attn,
because transformers' sdpa over one packed row lets each sequence attend to the ones before it."""

from __future__ import annotations

import sys

import pytest
import torch
from omegaconf import OmegaConf
from transformers import AutoModelForCausalLM
from vx_helpers import compose_config


def test_sdpa_over_a_packed_row_mixes_the_sequences(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, attn_implementation="sdpa", dtype=torch.float32)
    generator = torch.Generator().manual_seed(0)
    first, second = (
        torch.randint(5, 200, (1, 7), generator=generator),
        torch.randint(5, 200, (1, 5), generator=generator),
    )
    with torch.no_grad():
        alone = [model(input_ids=first).logits, model(input_ids=second).logits]
        # verl's remove-padding layout: one row, position ids restarting at each sequence
        packed = model(
            input_ids=torch.cat([first, second], 1), position_ids=torch.cat([torch.arange(7), torch.arange(5)])[None]
        ).logits
        # the layout used without flash-attn: one row per sequence, right-padded, with an attention mask
        padded_ids = torch.cat([second, torch.zeros(1, 2, dtype=torch.long)], 1)
        padded = model(
            input_ids=torch.cat([first, padded_ids]), attention_mask=torch.tensor([[1] * 7, [1] * 5 + [0] * 2])
        ).logits
    assert torch.allclose(packed[:, :7], alone[0], atol=1e-4)  # the first sequence sees only itself
    assert (packed[:, 7:] - alone[1]).abs().max() > 1e-2  # the second attends to the first: wrong log-probs
    assert torch.allclose(padded[1:, :5], alone[1], atol=1e-4)


def attention_settings(config) -> tuple[bool, str]:
    model = config.actor_rollout_ref.model
    return model.use_remove_padding, model.override_config.attn_implementation


def test_without_flash_attn_the_gpu_configs_use_sdpa_on_padded_rows():
    assert "flash_attn" not in sys.modules
    for name in ("memagent_7b", "memagent_14b", "smoke_gpu"):
        config = compose_config(name)
        assert attention_settings(config) == (False, "sdpa")
        OmegaConf.resolve(config)
        assert config.actor_rollout_ref.actor.use_remove_padding is False  # verl's actor reads it from the model


def test_with_flash_attn_the_gpu_configs_pack_rows_as_the_paper(tmp_path, monkeypatch):
    # Only the package's presence is asked (importlib.util.find_spec): an importable folder of that name stands in.
    (tmp_path / "flash_attn").mkdir()
    (tmp_path / "flash_attn" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert attention_settings(compose_config("memagent_7b")) == (True, "flash_attention_2")


@pytest.mark.parametrize("name", ["tiny_cpu", "replicate_cpu"])
def test_the_cpu_configs_say_sdpa_on_padded_rows_themselves(tmp_path, monkeypatch, name):
    (tmp_path / "flash_attn").mkdir()
    (tmp_path / "flash_attn" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert attention_settings(compose_config(name)) == (False, "sdpa")
