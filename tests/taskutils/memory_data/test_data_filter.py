"""Filtering questions answerable without context, through a local OpenAI-compatible endpoint.

The endpoint is a small HTTP server on 127.0.0.1 that answers like a model that knows some answers, so
the removal rules can be checked exactly; the client, requests and parquet plumbing are the real ones.
"""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pyarrow.parquet as pq
import pytest

from taskutils.memory_data import stages
from taskutils.memory_data.filtering import FilterSettings, answered_without_context
from taskutils.memory_data.sources import read_hotpotqa


def test_signals_on_hand_worked_cases():
    gts = ["Paris"]
    assert answered_without_context(["... so \\boxed{paris}"], gts) == {"boxed": True, "contains": True}
    assert answered_without_context(["I think it is PARIS, France"], gts) == {"boxed": False, "contains": True}
    assert answered_without_context(["\\boxed{Lyon}", "no idea"], gts) == {"boxed": False, "contains": False}
    # strict boxed: the last box in the last 300 characters; punctuation counts
    assert answered_without_context(["\\boxed{Paris.}"], gts)["boxed"] is False
    assert answered_without_context(["\\boxed{Paris}" + " " * 400], gts)["boxed"] is False


class _Handler(BaseHTTPRequestHandler):
    answers: dict = {}  # question -> reply text
    requests: list = []

    def do_POST(self):  # noqa: N802 (http.server's naming)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prompt = body["messages"][0]["content"]
        type(self).requests.append(body)
        question = prompt.split("\n")[0]
        text = type(self).answers.get(question, "I do not know. \\boxed{unknown}")
        reply = {
            "id": "x",
            "object": "chat.completion",
            "created": 0,
            "model": body["model"],
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10},
        }
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def endpoint():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1", server
    server.shutdown()
    server.server_close()


def test_filter_removes_answered_questions_and_resumes(tmp_path, sources, endpoint):
    url, server = endpoint
    data = read_hotpotqa(sources["hotpotqa_dev"])
    q = data.questions
    _Handler.answers = {
        q[1].question: f"The answer is \\boxed{{{q[1].answers[0]}}}",  # boxed signal
        q[3].question: f"Probably {q[3].answers[0].upper()} or so.",  # substring signal
    }
    _Handler.requests = []
    stages.hotpotqa_process(tmp_path, "dev", sources["hotpotqa_dev"], num_samples=8, num_docs=20)
    models = [(url, "base-model"), (url, "Instruct-model")]
    settings = FilterSettings(samples=2, concurrency=4)
    summary = stages.hotpotqa_filter(tmp_path, "dev", models, keep=5, settings=settings)
    assert summary["total"] == 8 and summary["removed"] == 2 and summary["kept"] == 5
    assert summary["base-model/boxed"] == 1 and summary["base-model/contains"] == 2
    rows = pq.read_table(tmp_path / "hotpotqa_dev.parquet").to_pylist()
    assert [r["extra_info"]["index"] for r in rows] == [0, 2, 4, 5, 6]  # first 5 survivors, file order
    assert rows[0]["context"].startswith("Document 1:\n")  # contexts copied along
    # paper sampling: bare question + boxed instruction, temperature 1.0, top_p 0.7, 512 tokens, 2 samples each
    first = _Handler.requests[0]
    # the filter prompt written out by hand: the bare question, then the boxed instruction
    assert first["messages"][0]["content"] in {f"{x.question}\nYour final answer in \\boxed{{}}.\n" for x in q[:8]}
    assert (first["temperature"], first["top_p"], first["max_tokens"]) == (1.0, 0.7, 512)
    assert len(_Handler.requests) == 8 * 2 * 2

    # Resume: cached responses are not asked again, even with the server gone.
    cache = tmp_path / "filter_dev.responses.jsonl"
    lines = cache.read_text().splitlines()
    cache.write_text("\n".join(lines[:-1]) + "\n" + lines[-1][:20])  # a kill cut the last line
    _Handler.requests = []
    again = stages.hotpotqa_filter(tmp_path, "dev", models, keep=5, settings=settings)
    assert again["kept"] == 5 and len(_Handler.requests) == 2  # only the cut question-model pair
    server.shutdown()
    server.server_close()
    assert stages.hotpotqa_filter(tmp_path, "dev", models, keep=5, settings=settings)["kept"] == 5
