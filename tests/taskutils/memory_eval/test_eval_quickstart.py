"""`python quickstart.py` as users run it: a subprocess that starts its own server (tiny; SmolLM2 with no
arguments, marked slow), or uses URL/API_KEY without ever printing the key, or fails with a clear message."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from eval_fixtures import VERIFY_AGENT
from scripted_calculator import calculator_app
from threaded_http import serve_in_a_thread

from recurrent.local_server import free_port

REPO = Path(__file__).resolve().parents[3]
SECRET = "sk-quickstart-SECRET-91b2"


def quickstart(
    *args: str, env: dict[str, str] | None = None, timeout: float = 300, cwd: Path = REPO
) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k not in ("URL", "API_KEY")}
    return subprocess.run(
        [sys.executable, str(REPO / "quickstart.py"), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**environ, **(env or {})},
        cwd=cwd,
    )


def test_quickstart_with_the_tiny_model(tmp_path):
    trace = tmp_path / "trace.jsonl"
    run = quickstart("--model", "tiny", "--chunk", "200", "--max-new", "16", "--trace", str(trace))
    assert run.returncode == 0, run.stderr[-3000:]
    out = run.stdout
    assert "starting transformers serve for tiny" in out and "question: What is the magic number?" in out
    chunks = int(out.split(" chunk(s) of up to 200")[0].rsplit("-> ", 1)[1])
    assert chunks >= 5  # the bundled document is ~1.4K tokens of SmolLM2 (more of the tiny BPE)
    for k in range(1, chunks + 1):
        assert f"--- memory after chunk {k}/{chunks} (" in out
    assert "--- final answer (" in out and "\nAnswer: " in out
    assert "\nTime: " in out and "\nTokens: " in out
    (record,) = [json.loads(line) for line in trace.read_text().splitlines()]
    assert len(record["memories"]) == chunks and record["num_chunks"] == chunks and record["error"] is None


def test_quickstart_against_a_url_never_prints_the_key(tiny_server):
    run = quickstart(
        "--model",
        tiny_server.model,
        "--chunk",
        "300",
        "--max-new",
        "8",
        env={"URL": tiny_server.base_url, "API_KEY": SECRET},
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert f"endpoint: {tiny_server.base_url}" in run.stdout and "\nAnswer: " in run.stdout
    assert "starting transformers serve" not in run.stdout
    assert SECRET not in run.stdout + run.stderr
    # A dead endpoint: a one-line error after the retries, still without the key (a short backoff: the three
    # retries are what is checked, not the default's 1 + 2 + 4 s of waiting).
    dead = quickstart(
        *("--model", "m", "--tokenizer", "tiny", "--backoff", "0.01"),
        env={"URL": f"http://127.0.0.1:{free_port()}/v1", "API_KEY": SECRET},
    )
    assert dead.returncode == 1 and "failed after 4 attempts" in dead.stderr and "error: chat request to" in dead.stderr
    assert SECRET not in dead.stdout + dead.stderr


def test_quickstart_errors_are_clear():
    missing = quickstart("--model", "no-such-org/no-such-model")
    assert missing.returncode == 2
    assert "neither a local folder nor in the local Hugging Face cache" in missing.stderr
    assert "set URL" in missing.stderr
    no_model = quickstart(env={"URL": "http://127.0.0.1:9/v1"})
    assert no_model.returncode == 2 and "pass --model" in no_model.stderr


def test_quickstart_runs_an_agent_file_from_anywhere(tmp_path):
    """``--agent path/to/agent.py`` (relative to the caller's directory) runs that agent through the registry
    against the endpoint: each model call printed, the boxed answer read."""
    (tmp_path / "agents").mkdir()
    (tmp_path / "agents" / "verify_agent.py").write_text(VERIFY_AGENT)
    seen: list[list[dict]] = []
    with serve_in_a_thread(calculator_app(seen), wait_s=30) as url:
        argv = (
            "--agent",
            "agents/verify_agent.py",
            "--model",
            "m",
            "--tokenizer",
            "tiny",
            "--question",
            "What is 6 * 7?",
        )
        run = quickstart(*argv, env={"URL": url}, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "agent: verify (agents/verify_agent.py)" in run.stdout and "question: What is 6 * 7?" in run.stdout
    assert run.stdout.count("\n--- call (") == 2 and "\nAnswer: 42\n" in run.stdout
    assert len(seen) == 2 and seen[1][-1]["content"] == "<tool_response>42</tool_response>"
    missing = quickstart("--agent", "agents/nope.py", "--model", "m", env={"URL": url}, cwd=tmp_path)
    assert missing.returncode == 2 and "agent file not found: agents/nope.py" in missing.stderr
    memory_option = quickstart(*argv[:2], "--chunk", "100", "--model", "m", env={"URL": url}, cwd=tmp_path)
    assert memory_option.returncode == 2 and "--chunk: options of the memory agent" in memory_option.stderr


@pytest.mark.slow(seconds=70)  # with the file's other quickstart runs
def test_quickstart_with_no_arguments_uses_smollm2(smollm2_dir):
    run = quickstart(timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    out = run.stdout
    assert "starting transformers serve for smollm2-135m-instruct" in out
    assert "-> 3 chunk(s) of up to 500" in out
    for k in (1, 2, 3):
        assert f"--- memory after chunk {k}/3 (" in out
    assert "--- final answer (" in out and "\nTime: " in out
    answer = out.split("\nAnswer: ", 1)[1].splitlines()[0]
    assert "7481" in answer, out[-2000:]  # the planted number, shown as the answer (seeded: the demo repeats)


@pytest.mark.parametrize(
    "reply, final_prompt, answer, note",
    [
        ("so the answer is 7481.", "answer_is", "7481", None),  # the paper's extraction
        ('The answer is "the number 7481."', "answer_is", "the number 7481.", "in any case: the paper's scorer"),
        ("Reasoning... \\boxed{7481}", "boxed", "7481", None),
        ("The Answer Is 7481", "boxed", "7481", "in any case"),
        ("The magic number is 7481. It was", "answer_is", "The magic number is 7481.", "first sentence: it has no"),
        ("7481\nmore", "boxed", "7481", "it has no \\boxed{} and no 'the answer is', so a scorer would count it wrong"),
        ("  ", "answer_is", "(none extracted)", "the reply is empty"),
    ],
)
def test_the_quickstart_shows_what_it_extracted(reply, final_prompt, answer, note):
    import importlib.util

    spec = importlib.util.spec_from_file_location("quickstart", REPO / "quickstart.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    shown, how = module.shown_answer(reply, final_prompt)
    assert shown == answer
    assert (how is None) if note is None else (note in how)
