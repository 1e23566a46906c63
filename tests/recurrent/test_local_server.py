"""Real `transformers serve` processes on free local ports, driven with the `openai` client."""

import pytest
from openai import OpenAI

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
