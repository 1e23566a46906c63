"""`python -m taskutils.endpoint` as a process: SIGTERM lets a document in flight finish within --shutdown-grace, or
cancels it (its client gets 503, its upstream request is closed), and the process exits 0; keys are never in its
log; a bad --config names its file, line and key."""

from __future__ import annotations

import os
import signal
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from readme_blocks import README, readme_commands
from serve_helpers import HTTP, REPO, WAIT, serve_command, serve_process, served, wait_event, wait_until

from taskutils.endpoint.cli import parse_args, serve, serve_settings

QUESTION = "Which river runs past the stone village?"
MESSAGES = [{"role": "user", "content": f"The river runs past the stone village.\n\n{QUESTION}"}]
UPSTREAM_KEY = "sk-upstream-SECRET-5be1"
SERVER_KEY = "sk-server-SECRET-0a77"


def _log_says(path: Path, text: str) -> bool:
    return text in path.read_text(errors="replace")


@pytest.fixture
def keys(monkeypatch):
    monkeypatch.setenv("TEST_UPSTREAM_KEY", UPSTREAM_KEY)
    monkeypatch.setenv("TEST_SERVER_KEY", SERVER_KEY)


def _args(scripted, tiny_model_dir: str, *extra: str) -> list[str]:
    return ["--upstream", scripted.url, "--model", scripted.model, "--tokenizer", tiny_model_dir, *extra]


def test_sigterm_lets_a_document_in_flight_finish(scripted, tiny_model_dir, tmp_path, keys):
    scripted.hold = {1}
    log = tmp_path / "serve.log"
    args = _args(scripted, tiny_model_dir, "--shutdown-grace", "600", "--log-level", "debug")
    args += ["--api-key-env", "TEST_UPSTREAM_KEY", "--server-key-env", "TEST_SERVER_KEY"]
    with serve_process(*args, log_path=log) as (base, process), ThreadPoolExecutor(1) as pool:
        headers = {"Authorization": f"Bearer {SERVER_KEY}"}
        request = {"model": scripted.model, "messages": MESSAGES}
        answer = pool.submit(HTTP.post, f"{base}/chat/completions", json=request, headers=headers, timeout=WAIT)
        wait_event(scripted.arrived[1], "the first turn upstream")
        process.send_signal(signal.SIGTERM)
        wait_until(lambda: _log_says(log, "shutting down: 1 document(s) in flight"), "the server to start draining")
        scripted.release()
        response = answer.result(WAIT)
        assert process.wait(WAIT) == 0
    assert response.status_code == 200 and response.json()["choices"][0]["message"]["content"] == scripted.reply
    assert scripted.requests == 2 and scripted.headers[0]["Authorization"] == f"Bearer {UPSTREAM_KEY}"
    text = log.read_text()
    assert "answered" in text and UPSTREAM_KEY not in text and SERVER_KEY not in text


def test_sigterm_cancels_a_document_past_the_grace(scripted, tiny_model_dir, tmp_path):
    scripted.hold = {1}  # never released: only the shutdown ends it
    log = tmp_path / "serve.log"
    with serve_process(*_args(scripted, tiny_model_dir, "--shutdown-grace", "0"), log_path=log) as (base, process):
        with ThreadPoolExecutor(1) as pool:
            request = {"model": scripted.model, "messages": MESSAGES}
            answer = pool.submit(HTTP.post, f"{base}/chat/completions", json=request, timeout=WAIT)
            wait_event(scripted.arrived[1], "the first turn upstream")
            process.send_signal(signal.SIGTERM)
            response = answer.result(WAIT)
        wait_event(scripted.aborted[1], "the upstream request to be closed")
        assert process.wait(WAIT) == 0
    error = response.json()["error"]
    assert response.status_code == 503 and error["code"] == "shutting_down"
    assert "cancelled after 0 of 2 turns" in error["message"]
    assert scripted.requests == 1


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(serve_command(*args), cwd=REPO, env=env, capture_output=True, text=True, timeout=WAIT)


def test_a_bad_config_file_names_file_line_and_key(tmp_path):
    config = tmp_path / "serve.yaml"
    config.write_text("chunk-size: 128\nmax_new: 16\nchunk-sise: 5\n")
    result = _run("--model", "x", "--upstream", "http://127.0.0.1:9/v1", "--config", str(config))
    assert result.returncode == 2
    assert f"{config}:3: unknown option 'chunk-sise' (did you mean 'chunk-size'?)" in result.stderr
    config.write_text("max-new: 0\n")
    result = _run("--model", "x", "--config", str(config))
    assert result.returncode == 2 and f"{config}:1: option 'max-new': must be a positive integer" in result.stderr


def _refused(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exit_:
        parse_args(argv)
    assert exit_.value.code == 2
    return capsys.readouterr().err


def test_the_command_line_refuses_what_it_cannot_serve(capsys):
    assert "--question-mode" in _run("--help").stdout
    assert "--model is required" in _refused(["--upstream", "http://127.0.0.1:9/v1"], capsys)
    unset = ["--model", "x", "--upstream", "http://127.0.0.1:9/v1", "--api-key-env", "NO_SUCH_VARIABLE_HERE"]
    assert "NO_SUCH_VARIABLE_HERE is not set" in _refused(unset, capsys)
    upstream = ["--model", "x", "--upstream", "http://127.0.0.1:9/v1"]
    for flag, value, said in (
        ("--temperature", "nan", "must be a finite number >= 0, got nan"),
        ("--top-p", "0", "must be a finite number in (0, 1], got 0"),
    ):  # the defaults of requests that give none: the rule of recurrent/sampling.py, as in a request
        assert f"error: argument {flag}: {said}" in _refused([*upstream, flag, value], capsys)
    for flag, value, said in (  # refused before the model loads, not by uvicorn after it
        ("--port", "70000", "must be a port in 1-65535, got 70000"),
        ("--port", "0", "must be a port in 1-65535, got 0"),
        ("--port", "-1", "must be a port in 1-65535, got -1"),
        ("--timeout", "0", "must be a finite number of seconds > 0, got 0"),
        ("--timeout", "nan", "must be a finite number of seconds > 0, got nan"),
        ("--timeout-per-token", "-1", "must be >= 0 seconds, got -1"),
        ("--timeout-per-token", "inf", "must be a finite number of seconds >= 0, got inf"),
        ("--backoff", "nan", "must be >= 0 seconds, got nan"),
        ("--backoff", "-1", "must be >= 0 seconds, got -1"),
        ("--max-retries", "-1", "must be an integer >= 0, got -1"),
        ("--ready-timeout", "0", "must be a finite number of seconds > 0, got 0"),
        ("--shutdown-grace", "inf", "must be a finite number of seconds >= 0, got inf"),
    ):
        assert f"error: argument {flag}: {said}" in _refused([*upstream, flag, value], capsys)
    assert parse_args([*upstream, "--port", "65535"]).port == 65535
    with pytest.raises(SystemExit) as no_tokenizer:  # a hosted model's name: no local tokenizer to count chunks
        serve(parse_args(["--model", "some-hosted-model", "--upstream", "http://127.0.0.1:9/v1"]), None)
    assert "no tokenizer for 'some-hosted-model' (pass --tokenizer" in str(no_tokenizer.value)


def test_the_flags_zero_for_no_limit_build_settings_without_a_limit():
    upstream = ["--model", "x", "--upstream", "http://127.0.0.1:9/v1"]
    settings = serve_settings(parse_args([*upstream, "--max-request-bytes", "0", "--max-context", "0"]))
    assert settings.max_request_bytes is None and settings.max_context is None  # 0: no limit (the flags' help)
    assert serve_settings(parse_args([*upstream, "--max-request-bytes", "10"])).max_request_bytes == 10
    # The model's context: 0 (the default) is the tokenizer's, a number is that many tokens (docs/serving.md).
    assert serve_settings(parse_args(upstream)).max_model_len is None
    assert serve_settings(parse_args([*upstream, "--max-model-len", "4096"])).max_model_len == 4096


def test_the_readme_section_runs(scripted, tiny_tokenizer, capsys):
    # Its command lines are the server's; its Python runs against a server (the README's name and address swapped).
    _, commands = readme_commands("## Serve a trained agent")
    lines = [argv[3:] for argv in commands if argv[:3] == ["python", "-m", "taskutils.endpoint"]]
    assert len(lines) == 2 and all(parse_args(argv).model for argv in lines)
    section = README.read_text().split("## Serve a trained agent", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    name = "BytedTsinghua-SIA/RL-MemoryAgent-14B"
    with served(scripted.url, scripted.model, tiny_tokenizer, model=name, chunk_size=16) as (base, _):
        exec(code.replace("http://127.0.0.1:8000/v1", base), {"long_document": "The river runs. " * 20})
    printed = capsys.readouterr().out
    assert printed.startswith(scripted.reply) and f"'{scripted.reply}'" in printed  # the answer, then the memories
