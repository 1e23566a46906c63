"""The server's command line in front of a real upstream (`transformers serve` with the tiny model), driven with
the official `openai` client: every question mode and the streamed answer give, at temperature 0, what the
evaluation harness (`python -m taskutils.memory_eval.run`, memory method, the same budgets) gives for the same item:
the answer, the memory after each chunk, the token counts. Without --upstream the server starts its own local
upstream and stops it with itself."""

from __future__ import annotations

import json
import signal

import httpx
import pytest
from openai import OpenAI
from serve_helpers import HTTP, WAIT, serve_process, served, sse_events

from taskutils.memory_eval.run import main as harness_main

QUESTION = "What is the secret code of Keeper7?"
# A HotpotQA-style context (documents separated by blank lines), as the harness's eval sets hold it.
DOCUMENTS = [
    "The river runs past the stone village. The old mill stands by the quiet meadow.",
    "The secret code of Keeper7 is 4821. Keeper7 guards the northern gate of the castle.",
    "Lanterns light the harbor at night. The market opens early on winter mornings.",
    "Copper bells ring in the orchard. The bridge was rebuilt after the spring flood.",
]
CONTEXT = "\n\n".join(f"Document {i + 1}:\n{d}" for i, d in enumerate(DOCUMENTS))
# The budgets of the harness's `tiny` entry (taskutils/memory_eval/models.yaml), given to the server by --config.
BUDGETS = {"chunk-size": 128, "max-new": 16, "final-max-new": 16}


@pytest.fixture(scope="module")
def harness(tiny_server, tiny_model_dir, tmp_path_factory) -> dict:
    """The harness's result line for the one item: answer ("response"), memories, turns, token counts."""
    data, results = tmp_path_factory.mktemp("data"), tmp_path_factory.mktemp("results")
    item = {"index": 0, "input": QUESTION, "context": CONTEXT, "answers": ["4821"]}
    (data / "eval_4.jsonl").write_text(json.dumps(item) + "\n")
    argv = ["--models", "tiny", "--tasks", "hotpotqa", "--lengths", "4", "--data-dir", str(data)]
    argv += ["--results-dir", str(results), "--url", tiny_server.base_url, "--served-model", tiny_server.model]
    argv += ["--tokenizer", tiny_model_dir, "--temperature", "0", "--trace", "--no-report", "--quiet"]
    assert harness_main(argv) == 0
    (path,) = results.glob("hotpotqa_4/*__memory.jsonl")
    (record,) = [json.loads(line) for line in path.read_text().splitlines()]
    assert record["error"] is None and record["turns"] > 2 and len(record["memories"]) == record["turns"] - 1
    return record


@pytest.fixture(scope="module")
def server(tiny_server, tiny_model_dir, tmp_path_factory):
    """``python -m taskutils.endpoint --upstream URL --model NAME`` with the budgets from --config; its base URL."""
    folder = tmp_path_factory.mktemp("server")
    config = folder / "serve.yaml"
    config.write_text("".join(f"{key}: {value}\n" for key, value in BUDGETS.items()))
    args = ["--upstream", tiny_server.base_url, "--model", tiny_server.model, "--served-model-name", "memagent"]
    args += ["--tokenizer", tiny_model_dir, "--config", str(config)]
    with serve_process(*args, log_path=folder / "serve.log") as (base, _):
        yield base


def client(base: str) -> OpenAI:
    return OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=WAIT)


SPLIT_ONE_MESSAGE = [{"role": "user", "content": f"{CONTEXT}\n\n{QUESTION}"}]
MODES = {
    # mode: (messages, memagent fields)
    "field": ([{"role": "user", "content": QUESTION}], {"document": CONTEXT}),
    "field, question in the field": ([], {"document": CONTEXT, "question": QUESTION}),
    "messages": (
        [
            {"role": "system", "content": "You are a careful reader."},  # not read: the agent's prompts are fixed
            {"role": "user", "content": CONTEXT},
            {"role": "user", "content": QUESTION},
        ],
        {},
    ),
    "split at the last blank line": (SPLIT_ONE_MESSAGE, {}),
    "split at a marker": (
        [{"role": "user", "content": f"{CONTEXT}\nQUESTION >> {QUESTION}"}],
        {"split_marker": "QUESTION >>"},
    ),
}


@pytest.mark.parametrize("mode", MODES)
def test_each_question_mode_answers_as_the_harness_does(server, harness, mode):
    messages, fields = MODES[mode]
    reply = client(server).chat.completions.create(
        model="memagent",
        messages=messages,
        temperature=0,
        extra_body={"memagent": {**fields, "return_memories": True}},
    )
    extension = reply.model_extra["memagent"]
    assert reply.choices[0].message.content == harness["response"]
    assert extension["memories"] == harness["memories"]
    assert extension["turns"] == harness["turns"] and extension["chunks"] == harness["num_chunks"]
    assert extension["document_tokens"] == harness["context_tokens"]
    assert reply.usage.prompt_tokens == harness["prompt_tokens"]
    assert reply.usage.completion_tokens == harness["completion_tokens"]
    assert extension["question_mode"] == mode.split(",")[0].split(" ")[0]


@pytest.fixture(scope="module")
def spooled_server(tiny_server, tiny_tokenizer):
    """The server in this process with every request held on disk (body, texts over 8 characters, the document
    tokenized 100 characters at a time): the long-request path of docs/serving.md, forced on a short item."""
    budgets = {key.replace("-", "_"): value for key, value in BUDGETS.items()}
    spooled = {"spool_bytes": 0, "spool_string_chars": 8, "tokenize_window": 100}
    with served(tiny_server.base_url, tiny_server.model, tiny_tokenizer, **budgets, **spooled) as (base, _):
        yield base


@pytest.mark.parametrize("mode", MODES)
def test_each_question_mode_of_a_request_on_disk_answers_as_the_harness_does(spooled_server, harness, mode):
    test_each_question_mode_answers_as_the_harness_does(spooled_server, harness, mode)


def test_the_streamed_answer_is_the_harness_answer_with_the_memories_as_they_come(server, harness):
    stream = client(server).chat.completions.create(
        model="memagent",
        messages=SPLIT_ONE_MESSAGE,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"memagent": {"return_memories": True}},
    )
    chunks = list(stream)
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    progress = [c.model_extra["memagent"] for c in chunks if not c.choices and c.model_extra.get("memagent")]
    (usage,) = [c.usage for c in chunks if c.usage is not None]
    (finish,) = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert content == harness["response"]
    assert [p["memory"] for p in progress] == harness["memories"]
    assert [p["chunk"] for p in progress] == list(range(1, harness["turns"]))
    assert (usage.prompt_tokens, usage.completion_tokens) == (harness["prompt_tokens"], harness["completion_tokens"])
    assert finish in ("stop", "length")


def test_a_plain_stream_has_only_openai_chunks_and_ends_with_done(server, harness):
    request = {"model": "memagent", "messages": SPLIT_ONE_MESSAGE, "temperature": 0, "stream": True}
    with HTTP.stream("POST", f"{server}/chat/completions", json=request, timeout=WAIT) as response:
        lines = list(response.iter_lines())
    events = list(sse_events(iter(lines)))
    assert response.headers["content-type"].startswith("text/event-stream")
    assert events[-1] == "[DONE]"
    assert all(e["object"] == "chat.completion.chunk" and e["choices"] for e in events[:-1])  # no usage chunk
    assert "".join(e["choices"][0]["delta"].get("content") or "" for e in events[:-1]) == harness["response"]
    assert sum(line.startswith(": read chunk") for line in lines) == harness["turns"] - 1  # progress comments


def test_without_upstream_the_server_runs_its_own_and_stops_it(tmp_path):
    args = ["--model", "tiny", "--chunk-size", "64", "--max-new", "8", "--final-max-new", "8"]
    with serve_process(*args, log_path=tmp_path / "serve.log") as (base, process):
        state = HTTP.get(base.removesuffix("/v1") + "/health", timeout=WAIT).json()
        reply = client(base).chat.completions.create(model="tiny", messages=SPLIT_ONE_MESSAGE, temperature=0)
        local = state["upstream"]["url"]
        assert state["status"] == "ok" and local != base and HTTP.get(f"{local}/models", timeout=WAIT).is_success
        process.send_signal(signal.SIGTERM)
        assert process.wait(WAIT) == 0
    assert reply.choices[0].message.content and reply.model_extra["memagent"]["chunks"] > 1
    with pytest.raises(httpx.ConnectError):  # the local upstream went with it
        HTTP.get(f"{local}/models", timeout=WAIT)


def test_the_comparison_has_teeth(server, harness):
    # Another question, the same document: the memories differ, so equal memories above mean the same reading.
    reply = client(server).chat.completions.create(
        model="memagent",
        messages=[{"role": "user", "content": "Which bells ring in the orchard?"}],
        temperature=0,
        extra_body={"memagent": {"document": CONTEXT, "return_memories": True}},
    )
    assert reply.model_extra["memagent"]["memories"] != harness["memories"]
