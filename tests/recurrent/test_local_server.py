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


def test_the_served_model_name_is_the_same_at_every_start(tiny_model_dir, tmp_path):
    """`python -m recurrent.local_server` prints the name requests use; a second start of the same model prints the
    same one, and a request made with it is answered (scripts and the endpoint's --model survive a restart)."""
    import os
    import signal
    import subprocess
    import sys

    from recurrent.local_server import free_port

    env = {**os.environ, "TMPDIR": str(tmp_path), "OMP_NUM_THREADS": "1"}
    names = []
    for _ in range(2):
        port = free_port()
        cmd = [sys.executable, "-m", "recurrent.local_server", "--model", str(tiny_model_dir), "--port", str(port)]
        process = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
        try:
            lines = dict(process.stdout.readline().strip().split("=", 1) for _ in range(2))  # URL=..., MODEL=...
            client = OpenAI(base_url=lines["URL"], api_key="unused")
            model = names[0] if names else lines["MODEL"]
            reply = client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=3, temperature=0
            )
            assert reply.choices[0].message.content is not None
            names.append(lines["MODEL"])
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=60)
    assert names[0] == names[1], names
