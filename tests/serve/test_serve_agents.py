"""Any registered agent serves through the endpoint, chosen by name: ``python -m recurrent.serve --agent calculator``
in front of a scripted upstream answers an OpenAI client's question with the agent's answer, after the agent's
tool call went upstream and its calculator's result came back in the conversation."""

from __future__ import annotations

from pathlib import Path

import pytest
from openai import OpenAI
from scripted_calculator import calculator_app
from serve_helpers import REPO, WAIT, serve_process
from threaded_http import serve_in_a_thread


def test_the_calculator_agent_is_served_by_name(tmp_path: Path, tiny_model_dir):
    seen: list[list[dict]] = []
    with serve_in_a_thread(calculator_app(seen), wait_s=WAIT) as upstream:
        args = ("--agent", "calculator", "--model", "m", "--upstream", upstream, "--tokenizer", tiny_model_dir)
        with serve_process(*args, log_path=tmp_path / "serve.log") as (url, _):
            client = OpenAI(base_url=url, api_key="unused", max_retries=0)
            reply = client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "What is 37 * 48?"}], temperature=0
            )
    assert reply.choices[0].message.content == "The result is \\boxed{1776}"
    assert len(seen) == 2  # the tool call, then the answer
    assert seen[0][-1] == {"role": "user", "content": "What is 37 * 48?"} and seen[0][0]["role"] == "system"
    assert seen[1][-1] == {"role": "user", "content": "<tool_response>1776</tool_response>"}


def test_an_unknown_agent_is_refused_before_any_server_starts(tmp_path: Path):
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "recurrent.serve", "--agent", "calculatr", "--model", "m", "--upstream", "http://x/v1"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=WAIT,
    )
    assert result.returncode == 2
    assert "--agent calculatr: no agent 'calculatr'" in result.stderr and "calculator" in result.stderr


pytestmark = pytest.mark.timeout(300)
