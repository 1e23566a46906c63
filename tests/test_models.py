"""The offline models: tiny (random Qwen2 + trained BPE) and SmolLM2 from its package."""

import filecmp
import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from recurrent import models
from recurrent.models import ModelNotAvailableError, build_tiny, materialize, resolve_model_path


def test_tiny_loads_generates_and_templates(tiny_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert model.config.model_type == "qwen2"
    n_params = sum(p.numel() for p in model.parameters())
    assert 1e5 < n_params < 1e6, n_params  # "a few hundred thousand"
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    assert tokenizer.pad_token_id != tokenizer.eos_token_id

    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the magic number?"}], tokenize=False, add_generation_prompt=True
    )
    assert text == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nWhat is the magic number?<|im_end|>\n<|im_start|>assistant\n"
    )
    # Special tokens are single ids, and text round-trips through the byte-level BPE.
    assert len(tokenizer.encode("<|im_start|>", add_special_tokens=False)) == 1
    sample = "Document 7:\nThe magic number is 40213, said Brountal."
    assert tokenizer.decode(tokenizer.encode(sample, add_special_tokens=False)) == sample

    ids = tokenizer(text, return_tensors="pt")
    out = model.generate(**ids, max_new_tokens=12, do_sample=False)
    assert out.shape[1] > ids["input_ids"].shape[1]
    # Greedy decoding is deterministic.
    again = model.generate(**ids, max_new_tokens=12, do_sample=False)
    assert torch.equal(out, again)


def test_tiny_assistant_mask_marks_content_and_eos(tiny_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    conv = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "forty two"}]
    enc = tokenizer.apply_chat_template(conv, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    masked = [t for t, m in zip(enc["input_ids"], enc["assistant_masks"], strict=True) if m]
    assert tokenizer.decode(masked) == "forty two<|im_end|>"


def test_tiny_is_byte_identical_across_materializations(tmp_path):
    a = build_tiny(tmp_path / "a", seed=0)
    b = build_tiny(tmp_path / "b", seed=0)
    c = build_tiny(tmp_path / "c", seed=1)
    files = sorted(p.name for p in a.iterdir())
    assert "model.safetensors" in files and "tokenizer.json" in files
    assert sorted(p.name for p in b.iterdir()) == files
    for name in files:
        assert filecmp.cmp(a / name, b / name, shallow=False), name
    assert not filecmp.cmp(a / "model.safetensors", c / "model.safetensors", shallow=False)


def test_materialize_is_idempotent_and_atomic(tmp_path):
    first = materialize(models.TINY, root=tmp_path)
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    second = materialize(models.TINY, root=tmp_path)
    assert second == first and (first / "model.safetensors").stat().st_mtime_ns == stamp
    # No temporary build folders are left behind.
    assert [p.name for p in tmp_path.iterdir()] == [models.TINY]
    manifest = json.loads((first / models.MANIFEST).read_text())
    assert manifest == {"name": "tiny", "recipe": models.RECIPE_VERSION["tiny"], "seed": 0}


def test_resolve_model_path(tiny_model_dir, tmp_path, monkeypatch):
    assert resolve_model_path(tiny_model_dir) == tiny_model_dir
    monkeypatch.setenv("MEMAGENT_MODELS_DIR", str(Path(tiny_model_dir).parent))
    assert resolve_model_path("tiny") == str(Path(tiny_model_dir))
    monkeypatch.setenv("MEMAGENT_MODELS_DIR", str(tmp_path))
    with pytest.raises(ModelNotAvailableError, match="python -m recurrent.models"):
        resolve_model_path("tiny")
    with pytest.raises(ModelNotAvailableError, match="local folder"):
        resolve_model_path("BytedTsinghua-SIA/RL-MemoryAgent-14B")


def test_smollm2_folder_loads(smollm2_dir):
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    assert tokenizer.chat_template and tokenizer.pad_token is not None
    assert tokenizer.pad_token_id != tokenizer.eos_token_id
    config = json.loads((Path(smollm2_dir) / "config.json").read_text())
    assert config["model_type"] == "llama" and config["num_hidden_layers"] == 30


def test_tiny_head64_is_tiny_with_heads_vllm_serves_on_cpu(tmp_path):
    """vLLM's CPU attention has kernels for head size 64, not 16 (docs/cluster.md, "vLLM on CPU")."""
    small = json.loads((materialize(models.TINY, root=tmp_path) / "config.json").read_text())
    wide = materialize(models.TINY_HEAD64, root=tmp_path)
    config = json.loads((wide / "config.json").read_text())
    assert small["hidden_size"] // small["num_attention_heads"] == 16
    assert config["hidden_size"] // config["num_attention_heads"] == 64
    assert config["num_hidden_layers"] == small["num_hidden_layers"] and config["vocab_size"] == small["vocab_size"]
    same = filecmp.cmp(tmp_path / models.TINY / "tokenizer.json", wide / "tokenizer.json", shallow=False)
    assert same, "the same tokenizer as tiny"
    assert json.loads((wide / models.MANIFEST).read_text())["name"] == models.TINY_HEAD64
