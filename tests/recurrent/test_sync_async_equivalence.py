"""Sync mode (token space, in-process HF backend) against async mode (chat messages, a real `transformers serve`),
greedy, on the tiny model: the same workflow definition gives the same memories and answers, and where the
two can differ is stated exactly:

1. The memory. Sync training puts the *generated ids* of the last reply into the next prompt (spec P21); an
   OpenAI-style endpoint sees the reply *text* and re-encodes it. Generated ids need not be the canonical
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

import pytest
import torch
from openai import OpenAI
from transformers import AutoTokenizer
from verl import DataProto

from recurrent.async_manager import run_sessions
from recurrent.backends.hf import HFBackend
from recurrent.client import OpenAIChatClient
from recurrent.impls.calculator import CalculatorConfig, CalculatorWorkflow
from recurrent.impls.memory import MemoryConfig, MemoryWorkflow
from recurrent.models import _english_like_corpus
from recurrent.serving import transformers_serve
from recurrent.sync_manager import SessionBatchAgent, SyncGenerationManager
from recurrent.trace import read_trace

GREEDY = {"temperature": 0.0}
CONFIG = MemoryConfig(chunk_size=64, max_chunks=None, max_memorization_length=12, max_final_response_length=12)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    with transformers_serve(tiny_model_dir) as running:
        yield running


@pytest.fixture(scope="module")
def batch():
    corpus = _english_like_corpus(7, lines=40)
    documents = ["", " ".join(corpus[:2]), " ".join(corpus[2:12])]  # 0, 1-2 and ~7 chunks of 64 tokens
    return [{"prompt": "What is the magic number?", "context": doc} for doc in documents]


def run_sync(workflow, batch, model_dir, tokenizer):
    manager = SyncGenerationManager(HFBackend(model_dir, batched=False), tokenizer, world_size=2)
    return manager.run(SessionBatchAgent(workflow), batch).sessions


def run_async(workflow, batch, server, trace_path=None):
    sessions = [workflow.session(sample) for sample in batch]
    client = OpenAIChatClient(server.base_url, server.model)
    rollout = run_sessions(sessions, client, GREEDY, progress=False, trace_path=trace_path)
    assert rollout.num_failed == 0, rollout.errors
    return sessions


def canonical_ids(tokenizer, turn):
    ids = tokenizer.apply_chat_template(turn.messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    return list(ids)


def test_sync_and_async_agree_when_the_memory_is_reencoded(batch, server, tiny_model_dir, tokenizer, tmp_path):
    sync = run_sync(MemoryWorkflow(CONFIG, tokenizer, reencode_memory=True), batch, tiny_model_dir, tokenizer)
    trace = tmp_path / "trace.jsonl"
    asyn = run_async(MemoryWorkflow(CONFIG, tokenizer, token_prompts=False), batch, server, trace)
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


def test_raw_memory_ids_are_where_the_modes_part(batch, tiny_model_dir, tokenizer):
    sessions = run_sync(MemoryWorkflow(CONFIG, tokenizer), batch, tiny_model_dir, tokenizer)
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
    session = workflow.session({"prompt": "Q?", "context": text})
    turn = session.next_turn()
    assert session.context_ids[:size].tolist() == ids[:size]  # sync: the exact slice, in the prompt
    assert turn.prompt_ids != canonical_ids(tokenizer, turn)  # async: the server re-encodes "\ufffd" text
    assert tokenizer.encode(tokenizer.decode(ids[:size]), add_special_tokens=False) != ids[:size]
    # Cuts between whole characters round-trip (this tokenizer's suffixes re-encode to themselves).
    assert tokenizer.encode(tokenizer.decode(ids[4:]), add_special_tokens=False) == ids[4:]


def test_calculator_workflow_runs_in_both_modes_alike(server, tiny_model_dir, tokenizer):
    batch = [{"prompt": "What is 6 times 7?"}, {"prompt": "Add 2 and 40."}]
    config = CalculatorConfig(max_turns=3, max_tokens_per_turn=10)
    sync = run_sync(CalculatorWorkflow(config, tokenizer), batch, tiny_model_dir, tokenizer)
    asyn = run_async(CalculatorWorkflow(config, tokenizer, token_prompts=False), batch, server)
    for s, a in zip(sync, asyn, strict=True):
        assert [r.reply.text for r in s.history] == [r.reply.text for r in a.history]
        assert len(s.history) >= 1


def test_server_reply_matches_in_process_greedy_generation(server, tiny_model_dir, tokenizer):
    """The two backends compute the same thing: one prompt, greedy, token for token."""
    messages = [{"role": "user", "content": "Document 3: the river city was born in 1867."}]
    reply = OpenAI(base_url=server.base_url, api_key="unused").chat.completions.create(
        model=server.model, messages=messages, max_tokens=16, temperature=0
    )
    ids = torch.tensor([tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)])
    prompts = DataProto.from_dict(
        {"input_ids": ids, "attention_mask": torch.ones_like(ids), "position_ids": torch.arange(ids.shape[1])[None]},
        meta_info={"max_tokens": 16, "pad_to": 16},
    )
    out = HFBackend(tiny_model_dir, batched=False).generate_sequences(prompts)
    generated = out.batch["responses"][0][out.batch["response_mask"][0].bool()].tolist()
    assert tokenizer.decode(generated, skip_special_tokens=True) == reply.choices[0].message.content
