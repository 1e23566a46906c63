"""Bad input that used to slip through (issue 20, item 3): each fails before any request, exit 2, with a message
naming the file, the line and the field; and an unreachable endpoint (item 4): refused by a check before the first
item, or, when it dies mid-run, the run stops after a few items in a row could not connect, keeping what finished.

Every "nothing was sent" below is shown by a closed port and a 10-minute backoff: had any item gone out, the run
would sit in its retries instead of exiting. The dying servers are driven by request counts, never by time."""

from __future__ import annotations

import asyncio
import errno
import importlib.util
import io
import json
import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from eval_fixtures import harness_argv, hotpotqa_set, read_lines
from process_helpers import load_script

from recurrent.local_server import free_port
from taskutils.memory_eval import run as run_module
from taskutils.memory_eval.report import main as report_main
from taskutils.memory_eval.run import main as run_main

REPO = Path(__file__).resolve().parents[3]
GOOD = {"index": 0, "input": "q?", "context": "some text", "answers": ["a"]}
NEVER = ("--backoff", "600")  # a request to the closed port would wait 10 minutes: the run must not send one


def closed_url() -> str:
    return f"http://127.0.0.1:{free_port()}/v1"  # bound, then closed: nothing listens there


def _line(item: dict | str | bytes) -> bytes:
    if isinstance(item, dict):
        item = json.dumps(item)
    return (item if isinstance(item, bytes) else item.encode()) + b"\n"


def run_on(tmp_path: Path, content: bytes, *extra: str, name: str = "eval_2.jsonl") -> tuple[int | str, Path, Path]:
    """The harness over one eval file (HotpotQA at 2 documents) against a closed port: (exit status, file,
    results folder)."""
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    (data / name).write_bytes(content)
    out = tmp_path / "results"
    argv = harness_argv(data, out, 2, "--models", "tiny", "--url", closed_url(), *NEVER, *extra)
    try:
        code = run_main(argv)
    except SystemExit as stop:  # argparse's exit (a --config error)
        code = stop.code
    return code, data / name, out


# ---- eval-set items ----

ITEMS = {  # the bad item, what the message says after "file:line: "
    "index a list": (GOOD | {"index": [1, 2]}, "field 'index' must be an integer or a string, got [1, 2]"),
    "index an object": (GOOD | {"index": {"i": 1}}, "field 'index' must be an integer or a string, got {'i': 1}"),
    "index true": (GOOD | {"index": True}, "field 'index' must be an integer or a string, got True"),
    "answers a bare string": (GOOD | {"answers": "a"}, "field 'answers' must be a non-empty list of strings, got 'a'"),
    "outputs a bare string": (
        {k: v for k, v in GOOD.items() if k != "answers"} | {"outputs": "7"},
        "field 'outputs' must be a non-empty list of strings, got '7'",
    ),
    "an answer null": (GOOD | {"answers": ["a", None]}, "field 'answers'[1] must be a non-empty string, got None"),
    "an output an object": (
        {k: v for k, v in GOOD.items() if k != "answers"} | {"outputs": [{"x": 2}]},
        "field 'outputs'[0] must be a non-empty string, got {'x': 2}",
    ),
    "an answer empty": (GOOD | {"answers": [""]}, "field 'answers'[0] must be a non-empty string, got ''"),
    "empty index context": (
        GOOD | {"context": []},
        "field 'context' is an empty list: an item needs at least one document",
    ),
}


@pytest.mark.parametrize("case", sorted(ITEMS))
def test_a_bad_field_stops_the_run_naming_file_line_and_field(tmp_path, capsys, case):
    item, expected = ITEMS[case]
    if not case.startswith("index"):
        item = item | {"index": 1}  # not a duplicate of the good item's index 0
    # The bad item on line 2: the good one before it would have been sent were the file not checked as a whole.
    code, path, out = run_on(tmp_path, _line(GOOD) + _line(item))
    err = capsys.readouterr().err
    assert code == 2, err[-2000:]
    assert f"error: {path}:2: {expected}" in err
    assert not list(out.glob("*/*.jsonl"))


def test_invalid_utf8_in_a_line_names_file_line_and_column(tmp_path, capsys):
    bad = b'{"index": 1, "input": "caf\xe9?", "context": "c", "answers": ["a"]}'
    # the byte 0xe9 is the 27th of its line: the 23 characters of '{"index": 1, "input": "', then 'caf'
    assert bad.index(b"\xe9") + 1 == 27
    code, path, out = run_on(tmp_path, _line(GOOD) + b"\n" + bad + b"\n")
    err = capsys.readouterr().err
    assert code == 2
    assert f"error: {path}:3:27: not valid UTF-8 (byte 0xe9: invalid continuation byte)" in err
    assert not list(out.glob("*/*.jsonl"))


def test_invalid_utf8_in_a_json_array_names_line_and_column(tmp_path, capsys):
    text = b'[\n  {"input": "q", "answers": ["a"],\n   "context": "ab\xff"}\n]'
    # line 3 is '   "context": "ab\xff"}': the byte is its 18th (3 spaces, the 12 characters of '"context": "', 'ab')
    code, path, _ = run_on(tmp_path, text, name="eval_2.json")
    err = capsys.readouterr().err
    assert code == 2 and f"error: {path}:3:18: not valid UTF-8 (byte 0xff: invalid start byte)" in err


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", ["eval_2.jsonl", "eval_2.json"])
def test_a_folder_named_as_an_eval_set_is_named_a_folder(tmp_path, capsys, name):
    """A folder where the eval set's file belongs is said to be one, with its path: not reported as no eval set."""
    data = tmp_path / "data"
    (data / name).mkdir(parents=True)
    out = tmp_path / "results"
    code = run_main(harness_argv(data, out, 2, "--models", "tiny", "--url", closed_url(), *NEVER))
    err = capsys.readouterr().err
    assert code == 2, err[-2000:]
    assert f"error: {data / name}: a folder, not a file (the eval set of hotpotqa at length 2)" in err
    assert "no eval set" not in err
    assert not out.exists() or not list(out.glob("*/*.jsonl"))


# ---- the model table (--table) and the run's --config file ----

TABLES = {
    "syntax error": ("models:\n  - {name: a, checkpoint: tiny\n", ":3:1: not valid YAML (expected ',' or '}'"),
    "unknown key": (
        "models:\n  - name: a\n    checkpoint: tiny\n    concurency: 1\n",
        ":4: model 'a': unknown field 'concurency' (did you mean 'concurrency'?); known: name, checkpoint,",
    ),
    "bare list entry": (
        "models:\n  - {name: a, checkpoint: tiny}\n  - tiny\n",
        ":3: model entry 2 must be a mapping of fields (name: ..., checkpoint: ...), got a string: 'tiny'",
    ),
    "non-numeric concurrency": (
        "models:\n  - name: a\n    checkpoint: tiny\n    concurrency: lots\n",
        ":4: model 'a': field 'concurrency' must be an integer, got 'lots'",
    ),
    "zero concurrency in defaults": (
        "defaults:\n  concurrency: 0\nmodels:\n  - {name: a, checkpoint: tiny}\n",
        ":2: defaults: field 'concurrency' must be >= 1, got 0",
    ),
    "a budget of the wrong type": (
        "models:\n  - name: a\n    checkpoint: tiny\n    memory:\n      chunk_size: 5k\n",
        ":5: model 'a', memory: field 'chunk_size' must be an integer, got '5k'",
    ),
    "an unknown method": (
        "models:\n  - {name: a, checkpoint: tiny, method: recurrent}\n",
        ":2: model 'a': field 'method' must be one of memory, memory-boxed, direct, direct-boxed, calculator, "
        "calculator_openai, got 'recurrent'",
    ),
    "no checkpoint": ("models:\n  - {name: a}\n", ":2: model 'a': field 'checkpoint' is missing; fields: name"),
    "duplicate names": (
        "models:\n  - {name: a, checkpoint: tiny}\n  - {name: a, checkpoint: x}\n",
        ":3: duplicate model name 'a' (first at ",
    ),
    "not a table": ("- a\n- b\n", ":1: expected a mapping with a 'models' list, got a list"),
}


@pytest.mark.parametrize("case", sorted(TABLES))
def test_a_bad_model_table_names_file_line_and_field(tmp_path, capsys, case):
    text, expected = TABLES[case]
    table = tmp_path / "table.yaml"
    table.write_text(text)
    code, _, out = run_on(tmp_path, _line(GOOD), "--table", str(table), "--models", "a")
    err = capsys.readouterr().err
    assert code == 2, err[-2000:]
    assert f"error: {table}{expected}" in err and "Traceback" not in err
    assert not list(out.glob("*/*"))


CONFIGS = {
    "syntax error": ("limit: [1, 2\n", ":2:1: not valid YAML (expected ',' or ']'"),
    "unknown key": (
        "limit: 2\nlimti: 3\n",
        ":2: unknown option 'limti' (did you mean 'limit'?); options: agent-config, backoff,",
    ),
    "bare list": ("- tiny\n- direct\n", ":1: expected a mapping of options (limit: 16, ...), got ['tiny', 'direct']"),
    "non-numeric concurrency": ("quiet: true\nconcurrency: many\n", ":2: option 'concurrency': must be an integer"),
    "zero limit": ("limit: 0\n", ":1: option 'limit': must be a positive integer, got 0"),
    "a switch given a number": ("trace: 1\n", ":1: option 'trace': must be true or false, got 1"),
    "an unknown choice": ("serve: docker\n", ":1: option 'serve': must be one of auto, vllm, transformers"),
}


@pytest.mark.parametrize("case", sorted(CONFIGS))
def test_a_bad_config_file_names_file_line_and_key(tmp_path, capsys, case):
    text, expected = CONFIGS[case]
    config = tmp_path / "run.yaml"
    config.write_text(text)
    code, _, out = run_on(tmp_path, _line(GOOD), "--config", str(config))
    err = capsys.readouterr().err
    assert code == 2
    assert f"error: {config}{expected}" in err and "Traceback" not in err
    assert not out.exists()


def test_a_good_config_file_still_sets_defaults(tmp_path):
    from taskutils.memory_eval.run import parse_args

    config = tmp_path / "run.yaml"
    config.write_text("lengths: [2, 4]\ntrace: true\nserve: vllm\nconcurrency: 8\nmax-connection-failures: 0\n")
    args = parse_args(["--config", str(config), "--concurrency", "2"])
    assert (args.lengths, args.trace, args.serve, args.concurrency) == ([2, 4], True, "vllm", 2)
    assert args.max_connection_failures == 0


# ---- a corrupt .meta.json, the report on a folder without results ----


def test_a_corrupt_meta_sidecar_is_named(tmp_path, capsys):
    out = tmp_path / "results"
    (out / "hotpotqa_2").mkdir(parents=True)
    (out / "hotpotqa_2" / "tiny__memory.jsonl").write_text(json.dumps({"id": 0, "error": None}) + "\n")
    meta = out / "hotpotqa_2" / "tiny__memory.meta.json"
    meta.write_text('{\n  "settings": {\n')  # cut short, as a full disk leaves it
    code, _, _ = run_on(tmp_path, _line(GOOD))
    err = capsys.readouterr().err
    assert code == 2
    assert f"error: {meta}:3:1: not valid JSON (Expecting property name enclosed in double quotes)" in err
    assert "delete it, or pass --overwrite" in err
    assert report_main([str(out)]) == 2  # the report reads the sidecars too
    assert f"error: {meta}:3:1: not valid JSON" in capsys.readouterr().err
    meta.write_text("[1, 2]")
    assert report_main([str(out)]) == 2
    assert f"error: {meta}: expected a JSON object with a 'settings' object, got [1, 2]" in capsys.readouterr().err


@pytest.mark.parametrize("folder", ["empty", "data folder", "missing"])
def test_the_report_refuses_a_folder_without_results(tmp_path, capsys, folder):
    target = tmp_path / folder
    if folder != "missing":
        target.mkdir()
    if folder == "data folder":  # a mistyped --results-dir: the eval sets' folder
        (target / "eval_2.jsonl").write_text(json.dumps(GOOD) + "\n")
        (target / "sources").mkdir()
    with pytest.raises(SystemExit) as stop:
        report_main([str(target)])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    what = "is not a folder" if folder == "missing" else "holds no results files (<task>_<length>/<model>__<method>"
    assert f"error: {target} {what}" in err
    assert not (target / "summary.md").exists()


# ---- quickstart: a zero chunk or cap is refused, not replaced by the default ----


@pytest.mark.parametrize(("flag", "value"), [("--chunk", "0"), ("--max-new", "0"), ("--chunk", "-5")])
def test_quickstart_refuses_a_non_positive_budget(capsys, flag, value):
    spec = importlib.util.spec_from_file_location("quickstart_args", REPO / "quickstart.py")
    quickstart = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(quickstart)
    with pytest.raises(SystemExit) as stop:
        quickstart.main([flag, value, "--model", "tiny"])
    assert stop.value.code == 2
    assert f"error: argument {flag}: must be a positive integer, got {value}" in capsys.readouterr().err


# ---- sampling values: the rule of recurrent/sampling.py, before anything starts (exit 2) ----

SEED_RULE = "must be an integer in [-9223372036854775808, 9223372036854775807]"  # 64-bit, as vLLM's seeds
BAD_SAMPLING_FLAGS = [
    ("--temperature", "-1", "must be a finite number >= 0, got -1"),
    ("--temperature", "nan", "must be a finite number >= 0, got nan"),
    ("--temperature", "inf", "must be a finite number >= 0, got inf"),
    ("--top-p", "0", "must be a finite number in (0, 1], got 0"),
    ("--top-p", "1.01", "must be a finite number in (0, 1], got 1.01"),
    ("--seed", "1.5", f"{SEED_RULE}, got '1.5'"),
    ("--seed", "18446744073709551616", f"{SEED_RULE}, got 18446744073709551616"),
]


@pytest.mark.parametrize(("flag", "value", "said"), BAD_SAMPLING_FLAGS)
def test_the_harness_refuses_a_bad_sampling_value(tmp_path, capsys, flag, value, said):
    code, _, out = run_on(tmp_path, _line(GOOD), flag, value)
    assert code == 2
    assert f"error: argument {flag}: {said}" in capsys.readouterr().err
    assert not out.exists()  # nothing ran


def test_the_harness_refuses_a_bad_sampling_value_in_its_config_file(tmp_path, capsys):
    config = tmp_path / "run.yaml"
    config.write_text("quiet: true\ntemperature: -0.5\n")
    code, _, out = run_on(tmp_path, _line(GOOD), "--config", str(config))
    assert code == 2
    assert f"error: {config}:2: option 'temperature': must be a finite number >= 0, got -0.5" in capsys.readouterr().err
    assert not out.exists()


BAD_TIMEOUT_FLAGS = [
    ("--timeout", "nan", "must be a finite number of seconds > 0, got nan"),
    ("--timeout", "inf", "must be a finite number of seconds > 0, got inf"),
    ("--timeout", "0", "must be a finite number of seconds > 0, got 0"),
    ("--timeout", "-1", "must be a finite number of seconds > 0, got -1"),
    ("--timeout-per-token", "-1", "must be >= 0 seconds, got -1"),
    ("--timeout-per-token", "nan", "must be >= 0 seconds, got nan"),
    ("--timeout-per-token", "inf", "must be a finite number of seconds >= 0, got inf"),
    ("--backoff", "nan", "must be >= 0 seconds, got nan"),
    ("--backoff", "-1", "must be >= 0 seconds, got -1"),
    ("--backoff", "inf", "must be a finite number of seconds >= 0, got inf"),
    ("--max-retries", "-1", "must be an integer >= 0, got -1"),
]  # the client options of every command (recurrent/flags.py): the endpoint's and the quickstart's tests reuse them


@pytest.mark.parametrize(("flag", "value", "said"), BAD_TIMEOUT_FLAGS)
def test_the_harness_refuses_a_bad_timeout(tmp_path, capsys, flag, value, said):
    code, _, out = run_on(tmp_path, _line(GOOD), flag, value)
    assert code == 2
    assert f"error: argument {flag}: {said}" in capsys.readouterr().err
    assert not out.exists()  # nothing ran


@pytest.mark.parametrize(("flag", "value", "said"), BAD_TIMEOUT_FLAGS)
def test_the_harness_refuses_a_bad_timeout_in_its_config_file(tmp_path, capsys, flag, value, said):
    config = tmp_path / "run.yaml"
    key = flag.removeprefix("--")
    config.write_text(f"quiet: true\n{key}: {'.nan' if value == 'nan' else '.inf' if value == 'inf' else value}\n")
    code, _, out = run_on(tmp_path, _line(GOOD), "--config", str(config))
    assert code == 2
    assert f"error: {config}:2: option '{key}': {said}" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize(("flag", "value", "said"), BAD_SAMPLING_FLAGS)
def test_quickstart_refuses_a_bad_sampling_value(capsys, flag, value, said):
    spec = importlib.util.spec_from_file_location("quickstart_args", REPO / "quickstart.py")
    quickstart = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(quickstart)
    with pytest.raises(SystemExit) as stop:
        quickstart.main([flag, value, "--model", "tiny"])
    assert stop.value.code == 2
    assert f"error: argument {flag}: {said}" in capsys.readouterr().err


# ---- item 4: an endpoint that does not answer ----


def test_a_closed_port_is_refused_before_the_first_item(tmp_path, capsys, caplog, tiny_model_dir):
    data = tmp_path / "data"
    data.mkdir()
    hotpotqa_set(data, 2, items=8)
    out = tmp_path / "results"
    url = closed_url()
    argv = harness_argv(data, out, 2, "--models", "tiny,smollm2-135m-instruct", "--url", url, *NEVER)
    assert run_main(argv) == 1
    err = capsys.readouterr().err
    assert f"tiny: skipped: the endpoint {url} does not answer (GET {url}/models failed: " in caplog.text
    assert "Connection refused" in caplog.text and "nothing was sent to it" in caplog.text
    # One endpoint for every model: the second is not tried (its tokenizer is not even loaded).
    assert f"stopping: --url {url} serves every selected model; not run: ['smollm2-135m-instruct']" in caplog.text
    assert "error: model(s) not evaluated: tiny, smollm2-135m-instruct" in err
    assert "tiny memory hotpotqa_2: 0 failed, 8 not run" in err
    assert not [r for r in caplog.records if r.name == "recurrent.client"]  # no request, so no retry
    assert not list(out.glob("*/*.jsonl"))


class ScriptedServer(load_script("instant_server").InstantServer):
    """An OpenAI-compatible server that answers chat requests until ``drop(n)`` says the n-th (1-based) is not
    to be answered: then it hangs up without a reply, and with ``die`` it also stops listening, so every later
    connection is refused (a server process that died). Runs in a thread with its own event loop."""

    def __init__(self, drop: Callable[[int], bool], die: bool = False) -> None:
        super().__init__(model="tiny", reply="Therefore, the answer is 1234.")
        self.drop, self.die = drop, die
        self.chat_requests = 0  # every chat request that reached the server, answered or not
        self.answered = 0
        self.listener: asyncio.Server | None = None

    async def _respond(self, path: str, method: str, body: bytes) -> tuple[int, dict]:
        if method == "POST" and path.endswith("/chat/completions"):
            self.chat_requests += 1
            if self.drop(self.chat_requests):
                if self.die:
                    self.listener.close()
                raise ConnectionResetError("hang up")  # InstantServer.handle closes the connection unanswered
            self.answered += 1
        return await super()._respond(path, method, body)

    @contextmanager
    def running(self) -> Iterator[str]:
        ready, loop_box = threading.Event(), {}

        async def main() -> None:
            loop_box["stop"] = asyncio.Event()
            loop_box["loop"] = asyncio.get_running_loop()
            self.listener = await asyncio.start_server(self.handle, "127.0.0.1", 0)
            loop_box["port"] = self.listener.sockets[0].getsockname()[1]
            ready.set()
            await loop_box["stop"].wait()
            self.listener.close()

        thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
        thread.start()
        ready.wait()
        try:
            yield f"http://127.0.0.1:{loop_box['port']}/v1"
        finally:
            loop_box["loop"].call_soon_threadsafe(loop_box["stop"].set)
            thread.join()


def _dying_run(tmp_path: Path, server: ScriptedServer, *extra: str) -> tuple[int, Path, Path]:
    """The harness over 8 items against ``server``: (exit status, results file, eval file)."""
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    if not (data / "eval_2.jsonl").exists():
        hotpotqa_set(data, 2, items=8)
    out = tmp_path / "results"
    with server.running() as url:
        # direct: one request per item; one item at a time, so the order of requests is the order of items
        argv = harness_argv(
            data, out, 2, "--models", "tiny", "--method", "direct", "--url", url, "--concurrency", "1",
            "--backoff", "0", *extra,
        )  # fmt: skip
        code = run_main(argv)
    return code, out / "hotpotqa_2" / "tiny__direct.jsonl", data / "eval_2.jsonl"


def test_a_server_that_dies_mid_run_stops_it_and_keeps_what_finished(tmp_path, capsys, caplog, tiny_model_dir):
    server = ScriptedServer(drop=lambda n: n > 3, die=True)  # answers 3 requests, then is gone
    code, results, data = _dying_run(tmp_path, server, "--max-retries", "1")
    err = capsys.readouterr().err
    assert code == 1
    assert server.answered == 3 and server.chat_requests == 4  # the 4th was cut; after it, connections are refused
    ids = [r["index"] for r in read_lines(data)]
    lines = read_lines(results)
    assert [r["id"] for r in lines] == ids[:3]  # the finished items, in order; none of the failed ones
    assert all(r["error"] is None and r["response"] for r in lines)
    assert "tiny: skipped: 3 items in a row could not connect to the endpoint (last: ChatRequestError:" in caplog.text
    assert "error: model(s) not evaluated: tiny" in err and "tiny direct hotpotqa_2: 0 failed, 5 not run" in err
    # The same command against a server that answers: the other 5 items run, once each.
    again = ScriptedServer(drop=lambda n: False)
    assert _dying_run(tmp_path, again, "--max-retries", "1")[0] == 0
    assert again.answered == 5
    assert sorted(r["id"] for r in read_lines(results)) == sorted(ids)


def test_a_dead_endpoint_is_given_a_bounded_number_of_requests(tmp_path, caplog, tiny_model_dir):
    # Answers 2 requests, then hangs up on every one (counted): 3 items in a row x (1 + 2 retries) requests.
    server = ScriptedServer(drop=lambda n: n > 2)
    code, results, _ = _dying_run(tmp_path, server, "--max-retries", "2")
    assert code == 1
    assert server.answered == 2 and server.chat_requests == 2 + 3 * 3
    assert [r["error"] for r in read_lines(results)] == [None, None]
    assert "3 items in a row could not connect" in caplog.text


def test_failures_between_answers_are_recorded_and_do_not_stop_the_run(tmp_path, capsys, tiny_model_dir):
    # Requests 3 and 4 are cut (2 items in a row, below the limit of 3); the endpoint answers again after them.
    server = ScriptedServer(drop=lambda n: n in (3, 4))
    code, results, data = _dying_run(tmp_path, server, "--max-retries", "0")
    err = capsys.readouterr().err
    assert code == 1 and server.chat_requests == 8
    errors = {r["id"]: r["error"] for r in read_lines(results)}
    ids = [r["index"] for r in read_lines(data)]
    assert sorted(errors) == sorted(ids)  # every item has its line
    failed = [i for i in ids if errors[i]]
    assert failed == ids[2:4] and all("ChatRequestError: chat request to" in errors[i] for i in failed)
    assert "tiny direct hotpotqa_2: 2 failed, 0 not run" in err


def test_a_success_ends_a_streak_of_connection_failures(tmp_path, capsys, tiny_model_dir):
    # Requests 2, 3 and 5 are cut: three failures in all, never three in a row (item 4 is answered between them),
    # so the run goes to the end with the limit of 3.
    server = ScriptedServer(drop=lambda n: n in (2, 3, 5))
    code, results, data = _dying_run(tmp_path, server, "--max-retries", "0")
    err = capsys.readouterr().err
    assert code == 1 and server.chat_requests == 8 and server.answered == 5
    ids = [r["index"] for r in read_lines(data)]
    errors = {r["id"]: r["error"] for r in read_lines(results)}
    assert sorted(errors) == sorted(ids)
    assert [i for i in ids if errors[i]] == [ids[1], ids[2], ids[4]]
    assert "tiny direct hotpotqa_2: 3 failed, 0 not run" in err


# ---- issue 36: text no model can be sent; the machine's own faults, in one line ----


@pytest.mark.parametrize(
    ("item", "said"),
    [
        (GOOD | {"input": "q\ud800?"}, "field 'input' holds a lone surrogate, '\\ud800' at character 1"),
        (GOOD | {"context": "some \udfff text"}, "field 'context' holds a lone surrogate, '\\udfff' at character 5"),
        (GOOD | {"answers": ["a", "b\udc00"]}, "field 'answers'[1] holds a lone surrogate, '\\udc00' at character 1"),
    ],
)
def test_a_lone_surrogate_stops_the_run_naming_file_line_and_field(tmp_path, capsys, item, said):
    # Once an item that failed with "TypeError: TextEncodeInput must be Union[...]" (or, in the question, a run
    # stopped by "'utf-8' codec can't encode character" naming no file): "\ud800" is half of a pair, not text.
    code, path, out = run_on(tmp_path, _line(GOOD) + _line(item | {"index": 1}))
    err = capsys.readouterr().err
    assert code == 2, err[-2000:]
    assert f"error: {path}:2: {said}: not a character, no model can be sent it" in err
    assert not list(out.glob("*/*.jsonl"))


def test_a_whole_surrogate_pair_is_one_character_and_runs(tmp_path, capsys):
    # The escape of 😀 as a pair is one character to json.loads: nothing to refuse (the closed port then skips it).
    code, _, _ = run_on(tmp_path, _line('{"index": 0, "input": "q \\ud83d\\ude00?", "context": "c", "answers": ["a"]}'))
    assert code == 1 and "lone surrogate" not in capsys.readouterr().err


def test_a_results_folder_it_cannot_write_is_one_line(tmp_path, capsys, monkeypatch):
    # The tests run as root, whom a read-only folder does not stop: the lock file's open raises what it would.
    real_open = Path.open

    def read_only(self, mode="r", *args, **kwargs):
        if self.name == ".lock":
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(self))
        return real_open(self, mode, *args, **kwargs)

    monkeypatch.setattr(Path, "open", read_only)
    code, _, out = run_on(tmp_path, _line(GOOD))
    err = capsys.readouterr().err
    assert code == 1
    assert err.strip().splitlines() == [
        f"error: cannot go on: {out / '.lock'}: Permission denied (EACCES); make the folder writable or pass another "
        "--results-dir: the items finished are saved whole, and the same command resumes after them"
    ]


class FullDisk(io.FileIO):
    """A results file on a disk with ``room`` bytes left: writes fill it, then fail as a full disk's do."""

    room = 0

    def write(self, data) -> int:
        if FullDisk.room <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # as a raw write raises it: no file named
        written = super().write(bytes(data)[: FullDisk.room])
        FullDisk.room -= written
        return written


def test_a_full_disk_mid_run_is_one_line_and_keeps_whole_items(tmp_path, capsys, monkeypatch, tiny_model_dir):
    real_open = Path.open

    def on_full_disk(self, mode="r", *args, **kwargs):
        if mode == "ab" and self.suffix == ".jsonl":  # the results file, appended a line per item
            return FullDisk(self, "ab")
        return real_open(self, mode, *args, **kwargs)

    for folder in (tmp_path / "data", tmp_path / "measure" / "data"):
        folder.mkdir(parents=True)
        hotpotqa_set(folder, 2, items=8)
    # The first two items' lines, measured on a disk with room, to fill the disk part-way into the third line (a
    # line's "seconds" may differ by a few characters between runs; a line is hundreds).
    with monkeypatch.context() as patch:
        FullDisk.room = 10**9
        patch.setattr(Path, "open", on_full_disk)
        code, results, _ = _dying_run(tmp_path / "measure", ScriptedServer(drop=lambda n: False), "--limit", "2")
        two = results.read_bytes()
    assert code == 0 and two.count(b"\n") == 2 and len(two) > 400
    monkeypatch.setattr(Path, "open", on_full_disk)
    FullDisk.room = len(two) + 40  # two lines and a bit of the third
    code, results, eval_file = _dying_run(tmp_path, ScriptedServer(drop=lambda n: False))
    err = capsys.readouterr().err
    assert code == 1
    assert (
        "Traceback" not in err
        and (
            f"error: cannot go on: {results}: No space left on device (ENOSPC); free some space, then run the same "
            "command again: the items finished are saved whole, and the same command resumes after them"
        )
        in err.splitlines()
    )
    ids = [r["index"] for r in read_lines(eval_file)]
    assert results.read_bytes().count(b"\n") == 2 and results.read_bytes().endswith(b"\n")  # no part of the third
    assert [r["id"] for r in read_lines(results)] == ids[:2]
    # Space freed: the same command runs the other 6, once each.
    monkeypatch.setattr(Path, "open", real_open)
    again = ScriptedServer(drop=lambda n: False)
    assert _dying_run(tmp_path, again)[0] == 0 and again.answered == 6
    assert [r["id"] for r in read_lines(results)] == ids


def _quickstart_module():
    spec = importlib.util.spec_from_file_location("quickstart_args", REPO / "quickstart.py")
    quickstart = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(quickstart)
    return quickstart


@pytest.mark.parametrize(("flag", "value", "said"), BAD_TIMEOUT_FLAGS)
def test_quickstart_refuses_a_bad_timeout(capsys, flag, value, said):
    # --timeout nan / 0 / -1 was taken, and every request then failed after the server had started.
    with pytest.raises(SystemExit) as stop:
        _quickstart_module().main([flag, value, "--model", "tiny"])
    assert stop.value.code == 2
    assert f"error: argument {flag}: {said}" in capsys.readouterr().err


def test_quickstart_exits_143_when_stopped_by_sigterm(capsys, monkeypatch):
    # The signal arrives while the question runs (raised in this process: its handler runs before raise_signal
    # returns); 143 is 128 + SIGTERM, the shells' convention, where the quickstart said 130 (Ctrl-C's).
    quickstart = _quickstart_module()
    monkeypatch.setattr(quickstart, "run", lambda args: signal.raise_signal(signal.SIGTERM))
    before = signal.getsignal(signal.SIGTERM)
    assert quickstart.main(["--model", "tiny"]) == 143
    assert "interrupted" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGTERM) is before  # its handler is put back


def test_quickstart_exits_130_on_ctrl_c(capsys, monkeypatch):
    quickstart = _quickstart_module()

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(quickstart, "run", interrupted)
    assert quickstart.main(["--model", "tiny"]) == 130


def test_the_harness_exits_143_when_stopped_by_sigterm(tmp_path, capsys, monkeypatch):
    # The fast form of tests/taskutils/memory_eval/test_eval_harness.py's real SIGTERM: the signal arrives while
    # models run.
    monkeypatch.setattr(run_module, "run_models", lambda *args: signal.raise_signal(signal.SIGTERM))
    before = signal.getsignal(signal.SIGTERM)
    code, _, _ = run_on(tmp_path, _line(GOOD))
    assert code == 143 and "interrupted: finished items are saved" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGTERM) is before
