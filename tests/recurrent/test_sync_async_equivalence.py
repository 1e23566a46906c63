"""Sync mode (the lockstep driver in token space, greedy generation in this process) against async mode (chat
messages, a real `transformers serve`), greedy, on the tiny model: the same workflow definition gives the same
memories and answers, and where the two can differ is stated exactly:

1. The memory. Sync training puts the *generated ids* of the last reply, eos and pad removed, into the next
   prompt (what the released training code does); an OpenAI-style endpoint sees the reply *text* and
   re-encodes it. Generated ids need not be the canonical
   encoding of their text (the model may spell "ou" as "o", "u"), so the next prompts differ in the memory
   segment. With ``reencode_memory=True`` the sync path uses ``encode(text)`` and the two agree.
2. Chunk seams. A chunk is a slice of the context ids; the endpoint re-encodes the decoded chunk inside the
   whole prompt. A slice that cuts a multi-byte character decodes to replacement characters, which re-encode
   to other ids (for this tokenizer, cuts between whole characters round-trip; tokenizers whose merges
   depend on a word's start can also differ at cuts inside a word).
3. Template seams. Literal pieces of the prompt are tokenized apart from the values (TokenTemplate); for this
   tokenizer every seam of the memory prompts falls on a pre-tokenizer boundary (asserted below), see
   test_templating.py for a seam where it does not.
"""

import asyncio

import pytest
import torch
from openai import OpenAI
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from recurrent.async_manager import run_sessions
from recurrent.client import OpenAIChatClient
from recurrent.generation_manager import run_lockstep
from recurrent.impls.memory import MemoryConfig, MemoryWorkflow
from recurrent.interface import Reply, Turn
from recurrent.models import _english_like_corpus
from recurrent.trace import read_trace

GREEDY = {"temperature": 0.0}
CONFIG = MemoryConfig(chunk_size=64, max_chunks=None, max_memorization_length=12, max_final_response_length=12)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def batch():
    corpus = _english_like_corpus(7, lines=40)
    documents = ["", " ".join(corpus[:2]), " ".join(corpus[2:12])]  # 0, 1-2 and ~7 chunks of 64 tokens
    return [{"prompt": "What is the magic number?", "context": doc} for doc in documents]


def greedy_ids(model, tokenizer, prompt_ids: list[int], max_tokens: int) -> list[int]:
    """One unpadded greedy generate: the new ids, up to and including the first eos."""
    config = GenerationConfig(
        max_new_tokens=max_tokens,
        do_sample=False,
        num_beams=1,
        repetition_penalty=1.0,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    ids = torch.tensor([prompt_ids])
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config)
    return out[0, ids.shape[1] :].tolist()


def run_sync(workflow, batch, model, tokenizer):
    """The episodes through the lockstep driver, each call generated from its token-space prompt."""

    async def generate(i: int, turn: Turn) -> Reply:
        ids = greedy_ids(model, tokenizer, turn.prompt_ids, turn.max_tokens)
        stopped = bool(ids) and ids[-1] == tokenizer.eos_token_id
        return Reply(
            text=tokenizer.decode(ids, skip_special_tokens=True),
            finish_reason="stop" if stopped else "length",
            token_ids=ids,
            prompt_tokens=len(turn.prompt_ids),
            completion_tokens=len(ids),
        )

    sessions = [workflow.episode(sample) for sample in batch]
    run = asyncio.run(run_lockstep(sessions, generate))
    assert run.num_failed == 0, run.errors
    return sessions


def run_async(workflow, batch, server, trace_path=None):
    sessions = [workflow.episode(sample) for sample in batch]
    client = OpenAIChatClient(server.base_url, server.model)
    rollout = run_sessions(sessions, client, GREEDY, progress=False, trace_path=trace_path)
    assert rollout.num_failed == 0, rollout.errors
    return sessions


def canonical_ids(tokenizer, turn):
    ids = tokenizer.apply_chat_template(turn.messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    return list(ids)


def test_sync_and_async_agree_when_the_memory_is_reencoded(batch, tiny_server, model, tokenizer, tmp_path):
    sync = run_sync(MemoryWorkflow(CONFIG, tokenizer, reencode_memory=True), batch, model, tokenizer)
    trace = tmp_path / "trace.jsonl"
    asyn = run_async(MemoryWorkflow(CONFIG, tokenizer, token_prompts=False), batch, tiny_server, trace)
    # The memory trace: per sample, the memory after every chunk, the answer, token counts and timings.
    lines = read_trace(trace)
    assert sorted(line["id"] for line in lines) == [0, 1, 2]
    for line in lines:
        session = asyn[line["id"]]
        assert line["memories"] == session.memory_trace and line["answer"] == session.answer
        assert len(line["turns"]) == session.num_chunks + 1 and line["turns"][-1]["final"]
        assert all(t["completion_tokens"] > 0 and t["seconds"] > 0 for t in line["turns"])
    assert [s.num_chunks for s in sync] == [0, 2, 7]
    for s, a in zip(sync, asyn, strict=True):
        # Precondition: every token-space prompt is exactly what the server builds from the messages.
        for rec in s.history:
            assert rec.turn.prompt_ids == canonical_ids(tokenizer, rec.turn)
        assert s.memory_trace == a.memory_trace and len(s.memory_trace) == s.num_chunks
        assert s.answer == a.answer and s.answer  # the tiny random model answers gibberish, but the same
        assert [r.reply.completion_tokens for r in s.history] == [r.reply.completion_tokens for r in a.history]


def test_raw_memory_ids_are_where_the_modes_part(batch, model, tokenizer):
    sessions = run_sync(MemoryWorkflow(CONFIG, tokenizer), batch, model, tokenizer)
    long = sessions[2]
    first, second = long.history[0], long.history[1]
    assert first.turn.prompt_ids == canonical_ids(tokenizer, first.turn)  # no memory yet: identical prompts
    generated = [t for t in first.reply.token_ids if t != tokenizer.eos_token_id]
    assert tokenizer.encode(first.reply.text, add_special_tokens=False) != generated  # non-canonical ids
    # The second prompt differs from the endpoint's only inside the memory segment.
    ours, theirs = second.turn.prompt_ids, canonical_ids(tokenizer, second.turn)
    head = next(i for i, (x, y) in enumerate(zip(ours, theirs, strict=False)) if x != y)
    tail = next(i for i, (x, y) in enumerate(zip(ours[::-1], theirs[::-1], strict=False)) if x != y)
    assert ours[head : len(ours) - tail] != theirs[head : len(theirs) - tail]
    memory_text = tokenizer.decode(ours[head : len(ours) - tail])
    assert memory_text in first.reply.text


def test_a_chunk_cut_inside_a_character_reencodes_differently(tokenizer):
    # Byte-level BPE spells "東" as three byte tokens; a chunk that ends after the first of them decodes to
    # U+FFFD replacement characters on both sides of the cut, which no re-encoding can undo.
    text = " 東京 café" * 4
    ids = tokenizer.encode(text, add_special_tokens=False)
    size = 2  # the first chunk is " " + the first byte of "東"
    assert "\ufffd" in tokenizer.decode(ids[:size]) and "\ufffd" in tokenizer.decode(ids[size : 2 * size])
    workflow = MemoryWorkflow(MemoryConfig(chunk_size=size, max_chunks=None), tokenizer, reencode_memory=True)
    reading = workflow.prepare({"prompt": "Q?", "context": text})
    turn = reading.memory_prompt(reading.initial_memory, next(reading.chunks()))  # the first call's prompt
    turn = Turn(turn.messages, CONFIG.max_memorization_length, turn.ids)
    assert reading.context_ids[:size].tolist() == ids[:size]  # sync: the exact slice, in the prompt
    assert turn.prompt_ids != canonical_ids(tokenizer, turn)  # async: the server re-encodes "\ufffd" text
    assert tokenizer.encode(tokenizer.decode(ids[:size]), add_special_tokens=False) != ids[:size]
    # Cuts between whole characters round-trip (this tokenizer's suffixes re-encode to themselves).
    assert tokenizer.encode(tokenizer.decode(ids[4:]), add_special_tokens=False) == ids[4:]


def test_server_reply_matches_in_process_greedy_generation(tiny_server, model, tokenizer):
    """The two generation paths compute the same thing: one prompt, greedy, token for token."""
    messages = [{"role": "user", "content": "Document 3: the river city was born in 1867."}]
    reply = OpenAI(base_url=tiny_server.base_url, api_key="unused").chat.completions.create(
        model=tiny_server.model, messages=messages, max_tokens=16, temperature=0
    )
    prompt_ids = list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False))
    generated = greedy_ids(model, tokenizer, prompt_ids, 16)
    assert tokenizer.decode(generated, skip_special_tokens=True) == reply.choices[0].message.content
