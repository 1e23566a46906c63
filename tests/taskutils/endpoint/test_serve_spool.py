"""Long requests held on disk (taskutils/endpoint/spool.py): the incremental parser (spooled_body.py) reads what
``json.loads`` reads and refuses what it refuses; a text on disk is cut by the question modes as the string is; a
document on disk is tokenized window by window into exactly the whole text's ids; through the endpoint (the
thresholds forced low) a spooled request sends the upstream the same prompts and answers with the same answer,
memories and usage as the in-memory path; its files are never listed on disk and none is open once the request ends,
however it ends."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import random
import socket
from pathlib import Path

import httpx
import numpy as np
import pytest
from serve_helpers import HTTP, WAIT, counters, served, sse_events, wait_event, wait_until
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from recurrent.tokens import encode_windows
from taskutils.endpoint import document_run as document_run_module
from taskutils.endpoint import spool as spool_module
from taskutils.endpoint import spooled_body as spooled_body_module
from taskutils.endpoint.protocol import LONG_TEXT_FIELDS
from taskutils.endpoint.questions import QuestionError, find_question
from taskutils.endpoint.spool import LongText, TextSpool
from taskutils.endpoint.spooled_body import parse_spooled

# Every body spooled, every string over 8 characters on disk, the document tokenized 200 characters at a time.
SPOOLED = {"spool_bytes": 0, "spool_string_chars": 8, "tokenize_window": 200}
QUESTION = "Which river runs past the stone village?"
DOCUMENT = "\n\n".join(
    f"Part {i}: the river, the stone and the village by the quiet meadow. Été, 😀 and a tab\there." for i in range(9)
)


def plain(value):
    """A parsed value with every LongText read back as a string."""
    if isinstance(value, LongText):
        return str(value)
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def parse(data: bytes, limit: int = 8):
    return parse_spooled(io.BytesIO(data), TextSpool(), limit, KEYS)


# ---- the parser ----

KEYS = LONG_TEXT_FIELDS | {"a", "b", " ", "\n", '"'}  # the random values' keys start with these too
CHARACTERS = ["a", "b", " ", "\n", '"', "\\", "/", "\t", "é", "€", "😀", "\ud83d", "\ude00", "\x01", "\u2028", "x" * 40]


def random_value(rng: random.Random, depth: int = 0):
    kind = rng.randrange(7 if depth < 3 else 4)
    if kind == 0:
        return "".join(rng.choice(CHARACTERS) for _ in range(rng.randrange(300)))
    if kind == 1:
        return rng.choice([0, -1, 12345678901234567890, 1.5, -2.5e-3, True, False, None])
    if kind == 2:
        return "".join(rng.choice(CHARACTERS) for _ in range(rng.randrange(4)))
    if kind == 3:
        return rng.random()
    if kind in (4, 5):
        return {"".join(rng.choice(CHARACTERS) for _ in range(3)): random_value(rng, depth + 1) for _ in range(3)}
    return [random_value(rng, depth + 1) for _ in range(rng.randrange(4))]


@pytest.mark.parametrize("block", [1, 3, 64, 4096])
def test_the_parser_reads_what_json_loads_reads(monkeypatch, block):
    monkeypatch.setattr(spooled_body_module, "READ_BLOCK", block)  # escapes and characters cut at every byte
    rng = random.Random(block)
    for _ in range(300):
        value = random_value(rng)
        data = json.dumps(value, ensure_ascii=rng.random() < 0.5, indent=rng.choice([None, 1])).encode(
            "utf-8", "surrogatepass"
        )
        assert plain(parse(data, rng.choice([1, 8, 10**9]))) == json.loads(data)
    # Escaped surrogates: a high one then a low one is one character; any other order or company is not.
    for text in [r'"\ud83d\ude00"', r'"\uD83D\uDE00x"', r'"\ud83d\u0041"', r'"\ud83dx"', r'"\ude00\ud83d"']:
        for limit in (1, 100):
            assert plain(parse(text.encode(), limit)) == json.loads(text)


def test_long_texts_are_on_disk_and_nothing_else_is():
    body = {"model": "m" * 9, "messages": [{"role": "user", "content": "x" * 9}], "k" * 20: "short", "stop": ["s" * 9]}
    body["memagent"] = {"document": "d" * 9, "question": "q" * 8, "split_marker": "Q" * 9}
    parsed = parse(json.dumps(body).encode())
    assert isinstance(parsed["messages"][0]["content"], LongText) and str(parsed["messages"][0]["content"]) == "x" * 9
    assert isinstance(parsed["memagent"]["document"], LongText) and str(parsed["memagent"]["document"]) == "d" * 9
    assert plain(parsed) == body
    assert [type(v) for v in (parsed["model"], parsed["stop"][0], parsed["memagent"]["split_marker"])] == [str] * 3
    assert type(parsed["memagent"]["question"]) is str  # 8 characters: not over the limit


@pytest.mark.parametrize(
    ("data", "said"),
    [
        (b"", "Expecting value at byte 0"),
        (b'{"a": 1,}', "Expecting property name enclosed in double quotes at byte 8"),
        (b"[1,]", "Expecting value at byte 3"),
        (b'{"a" 1}', "Expecting ':' delimiter at byte 5"),
        (b'{"a": 1 "b": 2}', "Expecting ',' delimiter at byte 8"),
        (b'{"a": "abc', "Unterminated string starting at byte 6"),
        (b'"a\x01b"', "Invalid control character at byte 2"),
        (b'"\\x"', "Invalid \\escape at byte 1"),
        (b'"\\u12G4"', "Invalid \\uXXXX escape at byte 1"),
        (b"{} x", "Extra data at byte 3"),
        (b'"\xff"', "can't decode byte 0xff"),
        (b'"\xe2\x82"', "unexpected end of data"),
    ],
)
def test_malformed_json_is_refused_naming_the_problem_and_where(data, said):
    with pytest.raises(ValueError):
        json.loads(data)  # json refuses it too
    with pytest.raises(ValueError) as refused:
        parse(data, 1)
    assert said in str(refused.value)


@pytest.mark.parametrize("block", [1, 3, 4096, 1 << 18])
def test_bytes_that_are_not_utf8_are_named_by_their_offset_in_the_body(monkeypatch, block):
    # Issue 36: a string read in pieces named the byte by its offset in the piece (89,337 for 1,400,057).
    monkeypatch.setattr(spooled_body_module, "READ_BLOCK", block)
    head = b'{"messages": [{"role": "user", "content": "'
    for filler, bad in [(b"a" * 1_400_000, b"\xff"), (b"\xc3\xa9" * 700_000, b"\xc3("), (b"ab", b"\xe9x")]:
        if block < 4096 and len(filler) > 100:
            continue  # a byte at a time through 1.4 MB is slow; the seams are the same
        data = head + filler + bad + b'"}]}'
        at = len(head) + len(filler)  # the first byte of ``bad``, counted by hand
        with pytest.raises(ValueError) as refused:
            parse(data, 8)
        assert f"can't decode byte 0x{bad[0]:02x} in position {at}: " in str(refused.value)


# ---- the question modes on a text on disk ----


def on_disk(text: str, pieces: int = 3, spool: TextSpool | None = None) -> LongText:
    """``text`` in a spool (a request's texts share one), as ``pieces`` ranges."""
    spool = spool or TextSpool()
    cuts = sorted(random.Random(len(text)).sample(range(len(text) + 1), pieces - 1)) if text else []
    parts, start = [], 0
    for cut in [*cuts, len(text)]:
        spool.append(text[start:cut])
        parts.append((spool.chars - (cut - start), spool.chars))
        start = cut
    return LongText(spool, parts)


TEXTS = [
    f"{DOCUMENT}\n\n{QUESTION}",
    f"{DOCUMENT}\n \t\n\n{QUESTION}  \n\t ",
    f"  \n{DOCUMENT}\n\n\n\n{QUESTION}\n\n",
    f"{DOCUMENT}\nQ >> {QUESTION}\nQ >> and again {QUESTION}\n",
    f"{DOCUMENT}\n\n",
    "no blank line here at all",
    "\u2003doc\u2003\n\nquestion\u2003",
]


@pytest.mark.parametrize("text", TEXTS)
def test_a_text_on_disk_is_cut_as_the_string_is(monkeypatch, text):
    monkeypatch.setattr(spool_module, "WRITE_CHARS", 7)  # windows far shorter than the texts

    def found(texts, mode, marker=None, document=None):
        try:
            result = find_question(texts, mode, marker, document)
        except QuestionError as err:
            return "error", str(err)
        return str(result.document).strip(), result.question.strip(), result.mode  # as the service strips them

    cases = [(["x", text], "split", None), ([text], "split", "Q >>"), ([text, QUESTION], "messages", None)]
    cases += [([text], "split", None), ([QUESTION], "field", None)]
    for texts, mode, marker in cases:
        document = text if mode == "field" else None
        expected = found(texts, mode, marker, document)
        spool = TextSpool()
        disk = [on_disk(t, spool=spool) for t in texts]
        assert found(disk, mode, marker, on_disk(text, spool=spool) if document else None) == expected, (mode, marker)
    long = on_disk(text)
    assert str(long.strip()) == text.strip() and long.rstrip_end() == len(text.rstrip())
    assert str(long.view(3, 11)) == text[3:11] and long[2:9] == text[2:9]


# ---- tokenizing a document on disk ----


def messy(seed: int, words: int) -> str:
    rng = random.Random(seed)
    pieces = ["the", "river", "Été", "😀", "\n\n", "  ", "\t", "1234", "don't", "x.y", "ＡＢＣ", "—", "\n"]
    return " ".join(rng.choice(pieces) for _ in range(words))


@pytest.mark.parametrize("model", ["tiny", "smollm2"])
def test_a_document_on_disk_tokenizes_as_the_whole_text(model, tiny_model_dir, smollm2_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir if model == "tiny" else smollm2_dir)
    backend = tokenizer.backend_tokenizer
    text = messy(seed=5, words=4000)  # ~20K characters: about 20 seams in 1000-character windows
    whole = tokenizer.encode(text, add_special_tokens=False)
    parts = list(encode_windows(on_disk(text, pieces=5), backend, 1000, 200))
    assert len(parts) > 10 and np.concatenate(parts).tolist() == whole
    # A long stretch with no white space (one word over several windows): cut inside the word, still exact.
    letters = "".join(random.Random(1).choice("abcdefghij") for _ in range(5000))
    glued = f"{text[:3000]} {letters} {text[3000:6000]}"
    parts = list(encode_windows(on_disk(glued), backend, 1000, 200))
    assert len(parts) > 10 and np.concatenate(parts).tolist() == tokenizer.encode(glued, add_special_tokens=False)


# ---- through the endpoint ----


def post(base: str, body: dict | bytes) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body)
    headers = {"Content-Type": "application/json"}
    return HTTP.post(f"{base}/chat/completions", content=content, headers=headers, timeout=WAIT)


REQUESTS = {
    "field": {"messages": [{"role": "user", "content": QUESTION}], "memagent": {"document": DOCUMENT}},
    "messages": {"messages": [{"role": "user", "content": DOCUMENT}, {"role": "user", "content": QUESTION}]},
    "split": {"messages": [{"role": "user", "content": f"{DOCUMENT}\n\n{QUESTION}\n"}]},
    "split at a marker": {
        "messages": [{"role": "user", "content": f"{DOCUMENT}\nQ >> {QUESTION}"}],
        "memagent": {"split_marker": "Q >>"},
    },
    "text parts": {
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": DOCUMENT}, {"type": "text", "text": "\nMore."}]},
            {"role": "user", "content": QUESTION},
        ]
    },
}


def read_both(scripted, tokenizer, request: dict, **settings) -> list[tuple[dict, list[dict]]]:
    """(response, the upstream's request bodies) from the in-memory path and from the spooled path."""
    results = []
    for extra in ({}, SPOOLED):
        scripted.bodies.clear()
        with served(scripted.url, scripted.model, tokenizer, chunk_size=24, **settings, **extra) as (base, _):
            body = {**request, "model": "memagent", "temperature": 0}
            body["memagent"] = {**body.get("memagent", {}), "return_memories": True}
            response = post(base, body)
        assert response.status_code == 200, response.text
        reply = response.json()
        del reply["id"], reply["created"]
        results.append((reply, list(scripted.bodies)))
    return results


@pytest.mark.parametrize("mode", REQUESTS)
def test_a_spooled_request_reads_as_the_in_memory_one(scripted, tiny_tokenizer, mode, caplog):
    scripted.reply = "memory 😀 so far"
    with caplog.at_level(logging.WARNING, logger="taskutils.endpoint"):
        (memory_reply, memory_turns), (spooled_reply, spooled_turns) = read_both(
            scripted, tiny_tokenizer, REQUESTS[mode]
        )
    assert "tokenized whole" not in caplog.text  # the spooled document was tokenized window by window
    assert len(memory_turns) > 4  # several chunks: the spooled ids were cut into chunks as the in-memory ones
    assert spooled_turns == memory_turns  # the same prompts, turn by turn
    assert spooled_reply == memory_reply  # the same answer, memories, usage and extension fields


def test_a_document_without_white_space_is_read_window_by_window(scripted, smollm2_dir, caplog):
    # No white space at all (the request's document is one word of letters): cut inside it, never tokenized whole.
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    letters = "".join(random.Random(2).choice("abcdefghij") for _ in range(1500))
    request = {"messages": [{"role": "user", "content": f"{letters}\n\n{QUESTION}"}]}
    with caplog.at_level(logging.WARNING, logger="taskutils.endpoint"):
        (memory_reply, memory_turns), (spooled_reply, spooled_turns) = read_both(scripted, tokenizer, request)
    assert "tokenized whole" not in caplog.text
    assert spooled_turns == memory_turns and spooled_reply == memory_reply and len(memory_turns) > 4


def disagreeing_tokenizer() -> PreTrainedTokenizerFast:
    """A real tokenizer whose window seams never agree: it marks the start of every input it is given, so a
    window that starts mid-text gets a mark the whole text has only once."""
    raw = Tokenizer(models.BPE(unk_token="[UNK]"))
    raw.normalizer = normalizers.Prepend("#")
    raw.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    raw.decoder = decoders.BPEDecoder()
    corpus = [f"{DOCUMENT} {QUESTION} {n}" for n in range(20)]
    raw.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=300, special_tokens=["[UNK]"], show_progress=False))
    return PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="[UNK]", eos_token="[UNK]")


def test_a_tokenizer_without_agreeing_seams_reads_a_document_whole_up_to_a_bound(scripted, caplog, monkeypatch):
    tokenizer = disagreeing_tokenizer()
    request = {"messages": [{"role": "user", "content": f"{DOCUMENT}\n\n{QUESTION}"}]}
    context = len(DOCUMENT.strip())  # what the spooled path tokenizes
    with caplog.at_level(logging.WARNING, logger="taskutils.endpoint"):
        (memory_reply, memory_turns), (spooled_reply, spooled_turns) = read_both(scripted, tokenizer, request)
    assert f"tokenizer seams do not agree; the {context}-character document is tokenized whole" in caplog.text
    assert spooled_turns == memory_turns and spooled_reply == memory_reply
    # Over the bound, the document is refused rather than tokenized whole in memory (~190 bytes a character).
    monkeypatch.setattr(document_run_module, "WHOLE_TOKENIZE_CHARS", context - 1)
    scripted.bodies.clear()
    with served(scripted.url, scripted.model, tokenizer, chunk_size=24, **SPOOLED) as (base, _):
        response = post(base, {**request, "model": "memagent"})
    assert response.status_code == 413 and response.json()["error"]["code"] == "document_too_large"
    said = f"the document ({context:,} characters) cannot be tokenized window by window (tokenizer seams do not agree)"
    assert said in response.json()["error"]["message"]
    assert scripted.requests == 0


def open_under(folder: Path) -> list[str]:
    """This process's open files and mappings under ``folder`` (the server runs in this process)."""
    fds = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(FileNotFoundError):  # the descriptor that listed the folder is gone already
            fds.append(os.readlink(f"/proc/self/fd/{fd}"))
    maps = [line.split(None, 5)[-1] for line in Path("/proc/self/maps").read_text().splitlines()]
    return [path for path in [*fds, *maps] if path.startswith(str(folder))]


def test_a_spooled_request_leaves_no_file_however_it_ends(scripted, tiny_tokenizer, tmp_path):
    folder = tmp_path / "spool"
    folder.mkdir()
    settings = {**SPOOLED, "spool_dir": str(folder), "chunk_size": 24}
    body = json.dumps({"model": "memagent", **REQUESTS["split"]}).encode()
    scripted.hold = {2}  # the first request's second turn waits upstream
    with served(scripted.url, scripted.model, tiny_tokenizer, **settings) as (base, _):
        port = int(base.split(":")[2].split("/")[0])
        client = socket.create_connection(("127.0.0.1", port))
        head = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        client.sendall(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
        wait_event(scripted.arrived[2], "the second turn to reach the upstream")
        during = open_under(folder)
        listed = list(folder.iterdir())
        client.close()  # the client goes away: the document is cancelled
        wait_until(lambda: counters(base)["cancelled"] == 1, "the document to be cancelled")
        after_disconnect = open_under(folder)
        scripted.hold = set()
        answered = post(base, body)
        after_answer = open_under(folder)
        scripted.fail = (500, {"error": {"message": "upstream broke"}})
        failed = post(base, body)
        after_failure = open_under(folder)
        refused = post(base, {"model": "memagent", "messages": [{"role": "user", "content": "no blank line" * 3}]})
        malformed = post(base, b'{"model": "memagent", "messages": [{"role": "user", "content": "abc\\q"}]}')
        after_refusals = open_under(folder)
    assert during and not listed  # open while the document reads, but never listed on disk (unlinked when made)
    assert after_disconnect == after_answer == after_failure == after_refusals == []
    assert answered.status_code == 200 and failed.status_code == 502 and "upstream broke" in failed.text
    assert refused.status_code == 400 and "found no question" in refused.json()["error"]["message"]
    error = malformed.json()["error"]["message"]
    assert malformed.status_code == 400 and error.startswith("the request body is not valid JSON: Invalid \\escape")
    assert list(folder.iterdir()) == []


def test_a_spooled_request_streams_what_the_in_memory_one_answers(scripted, tiny_tokenizer):
    request = {**REQUESTS["split"], "model": "memagent", "temperature": 0, "memagent": {"return_memories": True}}
    streamed = {}
    for name, extra in (("memory", {}), ("spooled", SPOOLED)):
        with served(scripted.url, scripted.model, tiny_tokenizer, chunk_size=24, **extra) as (base, _):
            plain_reply = post(base, request).json()
            with (
                httpx.Client(timeout=WAIT) as http,
                http.stream("POST", f"{base}/chat/completions", json={**request, "stream": True}) as response,
            ):
                events = list(sse_events(response.iter_lines()))
        assert events[-1] == "[DONE]"
        content = "".join(e["choices"][0]["delta"].get("content") or "" for e in events[:-1] if e["choices"])
        memories = [e["memagent"]["memory"] for e in events[:-1] if not e["choices"] and "memagent" in e]
        streamed[name] = (content, memories, plain_reply["choices"][0]["message"]["content"])
    content, memories, answer = streamed["memory"]
    assert content == answer and len(memories) > 4
    assert streamed["spooled"] == streamed["memory"]


# ---- the request-size limit ----


def test_a_body_over_the_size_limit_is_413_before_it_is_read(scripted, tiny_tokenizer):
    body = json.dumps({"messages": [{"role": "user", "content": f"{DOCUMENT}\n\n{QUESTION}"}]}).encode()
    limit = len(body) - 1  # one byte short

    def chunked():  # no Content-Length: the limit is found as the body arrives
        for at in range(0, len(body), 100):
            yield body[at : at + 100]

    headers = {"Content-Type": "application/json"}
    for spool in ({}, {"spool_bytes": 0}):  # read in memory, or into a file as it arrives
        with served(scripted.url, scripted.model, tiny_tokenizer, max_request_bytes=limit, **spool) as (base, _):
            declared = post(base, body)
            streamed = HTTP.post(f"{base}/chat/completions", content=chunked(), headers=headers, timeout=WAIT)
        for response in (declared, streamed):
            assert response.status_code == 413, response.text
            error = response.json()["error"]
            assert error["code"] == "request_too_large" and f"limit of {limit:,} bytes" in error["message"]
        assert declared.json()["error"]["message"] == (
            f"the request body is {len(body):,} bytes, over this server's limit of {limit:,} bytes "
            "(--max-request-bytes)"
        )
        assert streamed.json()["error"]["message"].startswith(  # arrived in 100-byte parts, over the limit
            f"the request body is over this server's limit of {limit:,} bytes (--max-request-bytes): it was "
            "refused when "
        )
    assert scripted.requests == 0
    with served(scripted.url, scripted.model, tiny_tokenizer, max_request_bytes=len(body)) as (base, _):
        at_limit = post(base, body)
        streamed = HTTP.post(f"{base}/chat/completions", content=chunked(), headers=headers, timeout=WAIT)
    assert at_limit.status_code == 200 and streamed.status_code == 200


def test_the_size_limit_defaults_to_64_mib_and_0_lifts_it():
    from taskutils.endpoint.cli import parse_args

    assert parse_args(["--model", "x"]).max_request_bytes == 64 * 2**20 == spool_module.MAX_REQUEST_BYTES
    assert parse_args(["--model", "x", "--max-request-bytes", "0"]).max_request_bytes == 0  # None in the settings
