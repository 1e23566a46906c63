"""Real `transformers serve` processes on free local ports, driven with the `openai` client."""

import json
from pathlib import Path

import pytest
import torch
from openai import OpenAI
from transformers import AutoModelForCausalLM, AutoTokenizer

from recurrent.local_server import transformers_serve


def test_tiny_model_serves_chat(tiny_model_dir):
    with transformers_serve(tiny_model_dir) as server:
        client = OpenAI(base_url=server.base_url, api_key="unused")
        reply = client.chat.completions.create(
            model=server.model, messages=[{"role": "user", "content": "hello"}], max_tokens=5, temperature=0
        )
        assert reply.usage.completion_tokens <= 5
        process = server.process
    assert process.poll() is not None  # stopped on exit


@pytest.mark.slow
def test_smollm2_answers_through_transformers_serve(smollm2_dir):
    with transformers_serve(smollm2_dir) as server:
        client = OpenAI(base_url=server.base_url, api_key="unused")
        reply = client.chat.completions.create(
            model=server.model,
            messages=[{"role": "user", "content": "What is the capital of France?"}],
            max_tokens=20,
            temperature=0,
        )
        assert "Paris" in reply.choices[0].message.content


def greedy_text(model_dir: str, messages: list[dict], dtype: torch.dtype, new_tokens: int) -> str:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True, return_tensors="pt")
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    out = model.generate(prompt["input_ids"], max_new_tokens=new_tokens, do_sample=False)
    return tokenizer.decode(out[0, prompt["input_ids"].shape[1] :], skip_special_tokens=True)


def test_a_checkpoint_whose_config_says_bf16_is_served_in_fp32(tiny_model_dir, tmp_path):
    """verl's export writes "dtype": "bfloat16" into config.json over fp32 weights; `transformers serve` would
    take the config's dtype. Served on CPU, the model computes in fp32, as the CPU twin trained and sampled it: its
    greedy reply is in-process fp32 generation's, which (for this prompt) bf16 generation's is not."""
    export = tmp_path / "export"
    export.mkdir()
    for entry in Path(tiny_model_dir).iterdir():
        if entry.name != "config.json":
            (export / entry.name).symlink_to(entry)
    config = json.loads((Path(tiny_model_dir) / "config.json").read_text())
    (export / "config.json").write_text(json.dumps({**config, "dtype": "bfloat16"}))
    messages = [{"role": "user", "content": "hello there"}]
    fp32 = greedy_text(str(export), messages, torch.float32, 24)
    assert fp32 != greedy_text(str(export), messages, torch.bfloat16, 24)  # the prompt tells the two apart
    with transformers_serve(export) as server:
        client = OpenAI(base_url=server.base_url, api_key="unused")
        reply = client.chat.completions.create(model=server.model, messages=messages, max_tokens=24, temperature=0)
    assert reply.choices[0].message.content == fp32
