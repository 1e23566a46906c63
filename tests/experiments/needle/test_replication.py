"""The replication's needle task, reader tokenizer, SFT step and naive teacher (CPU, seconds)."""

import random

import pytest
import torch
from scripted_turns import run_scripted

from experiments.needle.needle import (
    NEEDLE,
    SPLITS,
    make_decoy_start,
    make_document,
    make_documents,
    make_late_start,
    split_keys,
    split_numbers,
)
from experiments.needle.reader import build_tokenizer, reader_config
from experiments.needle.warm_start import P_NEEDLE, agent_config, paper_rows, teacher_transcript
from experiments.sft import batch_loss
from recurrent.impls.memory import MemoryConfig, MemoryWorkflow
from recurrent.interface import Reply


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def test_splits_share_no_needle(tokenizer):
    # Hand-checked: key ADJ[a]-NOUN[n] goes to split (a + n) % 3.
    assert "brave-otter" in split_keys("train")  # (0 + 0) % 3 = 0
    assert "brave-heron" in split_keys("validation")  # (0 + 1) % 3 = 1
    assert "calm-heron" in split_keys("test")  # (1 + 1) % 3 = 2
    keys = {s: set(split_keys(s)) for s in SPLITS}
    numbers = {s: set(split_numbers(s)) for s in SPLITS}
    for a in SPLITS:
        for b in SPLITS:
            if a < b:
                assert not keys[a] & keys[b] and not numbers[a] & numbers[b]
    docs = {s: make_documents(tokenizer, s, 12, [1, 2], seed=3) for s in SPLITS}
    needles = {s: {d["needle"] for d in docs[s]} for s in SPLITS}
    for s in SPLITS:
        assert all(d["key"] in keys[s] and int(d["value"]) in numbers[s] for d in docs[s])
    assert not needles["train"] & needles["validation"]
    assert not needles["train"] & needles["test"]
    assert not needles["validation"] & needles["test"]


def test_the_numbers_are_dealt_to_the_splits_by_a_seeded_shuffle_not_by_an_arithmetic_rule():
    numbers = {s: split_numbers(s) for s in SPLITS}
    # every 4-digit number in exactly one split, 3,000 each, the same deal every time
    assert sorted(n for s in SPLITS for n in numbers[s]) == list(range(1000, 10000))
    assert all(len(numbers[s]) == 3000 for s in SPLITS)
    assert numbers == {s: split_numbers(s) for s in SPLITS}
    # the old rule, v % 3, is no longer the split: each split holds every residue (~1,000 each; a fair deal puts
    # 1,000 +- ~26 of each residue in a split, so 850 is far outside chance), and so does the residue of the
    # sum of the two two-digit halves a reader sees, (100 a + b) % 3 = (a + b) % 3
    for s in SPLITS:
        assert min(sum(1 for v in numbers[s] if v % 3 == r) for r in range(3)) > 850
    # every two-digit token occurs in training numbers as a first half (10-99) and as a second half (00-99), so no
    # token of a test number is unseen in training
    train = numbers["train"]
    assert {f"{v // 100:02d}" for v in train} == {f"{i:02d}" for i in range(10, 100)}
    assert {f"{v % 100:02d}" for v in train} == {f"{i:02d}" for i in range(100)}


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_a_document_of_n_chunks_has_n_chunks(tokenizer, n):
    workflow = MemoryWorkflow(MemoryConfig(chunk_size=64, max_chunks=None), tokenizer)
    rng = random.Random(n)
    for _ in range(3):
        doc = make_document(rng, tokenizer, n, "validation")
        session = workflow.episode({"context": doc["context"], "prompt": doc["question"]})
        assert session.num_chunks == n
        texts = [tokenizer.decode(session.context_ids[i * 64 : (i + 1) * 64]) for i in range(n)]
        assert [doc["needle"] in t for t in texts] == [i == doc["needle_chunk"] for i in range(n)]


@pytest.mark.parametrize("n", [1, 4])
def test_an_episode_that_starts_late_holds_the_needle_in_memory_and_only_filler_in_its_chunks(tokenizer, n):
    workflow = MemoryWorkflow(MemoryConfig(chunk_size=64, max_chunks=None, memory_key="memory"), tokenizer)
    doc = make_late_start(random.Random(n), tokenizer, n, "train")
    assert doc["memory"] == doc["needle"] == NEEDLE.format(key=doc["key"], value=doc["value"])
    assert doc["needle_chunk"] == -1 and doc["value"] not in doc["context"] and "magic" not in doc["context"]
    session = workflow.episode({"context": doc["context"], "prompt": doc["question"], "memory": doc["memory"]})
    assert session.num_chunks == n
    first = run_scripted(session, lambda k, turn: Reply("m", "stop"))[0]
    assert f"<memory>\n{doc['needle']}\n</memory>" in first.messages[0]["content"]
    # the needle sentence fits the memory the agent writes (32 tokens)
    assert len(tokenizer.encode(doc["memory"], add_special_tokens=False)) <= 32


def test_late_start_is_a_share_of_the_training_documents(tokenizer):
    plain = make_documents(tokenizer, "train", 8, [1, 2], seed=3)
    rng = random.Random("3-train")  # the paper's documents: the stream of make_document, unchanged
    assert plain == [make_document(rng, tokenizer, [1, 2][i % 2], "train") for i in range(8)]
    mixed = make_documents(tokenizer, "train", 200, [1, 2, 3, 4], seed=3, late_start=0.5)
    late = [d for d in mixed if d["needle_chunk"] == -1]
    assert 70 <= len(late) <= 130  # binomial(200, 0.5): mean 100, sd ~7
    assert [d["num_chunks"] for d in mixed] == [1, 2, 3, 4] * 50
    assert all(d.get("memory") == d["needle"] for d in late) and not any("memory" in d for d in mixed if d not in late)
    assert len(make_documents(tokenizer, "train", 20, [2], late_start=1.0)) == 20
    with pytest.raises(ValueError, match="late_start must be a share"):
        make_documents(tokenizer, "train", 2, [1], late_start=1.5)


@pytest.mark.parametrize("n", [1, 4])
def test_an_episode_that_starts_from_a_wrong_memory_must_overwrite_it(tokenizer, n):
    doc = make_decoy_start(random.Random(n), tokenizer, n, "train")
    # the paper's document (the needle in one chunk), with the asked key's needle and another number in memory
    plain = make_document(random.Random(n), tokenizer, n, "train")
    assert {k: v for k, v in doc.items() if k != "memory"} == plain
    wrong = doc["memory"].removeprefix(f"The special magic number for {doc['key']} is ").removesuffix(".")
    assert doc["memory"] == NEEDLE.format(key=doc["key"], value=wrong)
    assert wrong.isdigit() and len(wrong) == len(doc["value"]) and wrong != doc["value"]
    assert doc["needle"] in doc["context"] and doc["memory"] not in doc["context"]


def test_late_and_decoy_starts_are_shares_of_the_training_documents(tokenizer):
    mixed = make_documents(tokenizer, "train", 200, [1, 2], seed=3, late_start=0.25, decoy_start=0.25)
    late = [d for d in mixed if d["needle_chunk"] == -1]
    decoy = [d for d in mixed if d["needle_chunk"] >= 0 and "memory" in d]
    assert 30 <= len(late) <= 70 and 30 <= len(decoy) <= 70  # binomial(200, 0.25): mean 50, sd ~6
    assert all(d["memory"] != d["needle"] and d["key"] in d["memory"] for d in decoy)
    with pytest.raises(ValueError, match="at most 1"):
        make_documents(tokenizer, "train", 2, [1], late_start=0.6, decoy_start=0.6)


def test_numbers_are_two_digit_tokens_and_prompts_round_trip(tokenizer):
    from recurrent.impls.memory import FINAL_TEMPLATE_BOXED, MEMORY_TEMPLATE

    # a 4-digit number is two tokens, its halves; an odd digit left over is a one-digit token
    pieces = [tokenizer.decode([i]) for i in tokenizer.encode("is 7445 and 90817 and 3", add_special_tokens=False)]
    assert [p for p in pieces if p.strip().isdigit()] == ["74", "45", "90", "81", "7", "3"]
    for text in (MEMORY_TEMPLATE, FINAL_TEMPLATE_BOXED, NEEDLE.format(key="odd-tiger", value="4711")):
        assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text
    # the 100 pairs are added on top of the learned BPE (asked for 1,024; this corpus gives fewer merges)
    assert 512 < len(tokenizer) <= 1024 + 100
    assert all(len(tokenizer.encode(p, add_special_tokens=False)) == 1 for p in ("00", "07", "99"))


def test_a_memory_turn_with_a_full_chunk_and_memory_is_200_to_340_tokens(tokenizer):
    workflow = MemoryWorkflow(agent_config(), tokenizer)
    doc = make_document(random.Random(0), tokenizer, 3, "train")
    session = workflow.episode({"context": doc["context"], "prompt": doc["question"]})
    memory = tokenizer.encode(" ".join([doc["needle"]] * 3), add_special_tokens=False)[:32]
    turns = run_scripted(session, lambda k, turn: Reply(tokenizer.decode(memory), "length", memory))
    turn = turns[1]  # the middle chunk of 3 has exactly 64 tokens; the memory has 32
    assert turn.meta["chunk_tokens"] == 64 and len(memory) == 32
    assert 200 <= len(turn.prompt_ids) <= 340


def test_three_sft_steps_lower_the_loss_on_a_fixed_batch(tokenizer):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    config = reader_config(tokenizer, hidden=32, layers=1, heads=2, kv_heads=1)
    model = AutoModelForCausalLM.from_config(config)
    rows = paper_rows(MemoryWorkflow(agent_config(), tokenizer), random.Random(0), 2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(3):
        loss, *_ = batch_loss(model, rows, tokenizer.pad_token_id)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    final, *_ = batch_loss(model, rows, tokenizer.pad_token_id)
    assert final.item() < losses[0]


HAND_MEMORY_PROMPT = (
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
    "You are presented with a problem, a section of an article that may contain the answer to the problem, "
    "and a previous memory. Please read the provided section carefully and update the memory with the new "
    "information that helps to answer the problem. Be sure to retain all relevant details from the previous "
    "memory while adding any new, useful information.\n\n"
    "<problem> \nWhat is the special magic number for odd-tiger mentioned in the provided text?\n</problem>\n\n"
    "<memory>\nNo previous memory\n</memory>\n\n"
    "<section>\nThe farmer painted a tall tree. The special magic number for odd-tiger is 4711. "
    "A small dog found the school.\n</section>\n\n"
    "Updated memory:\n<|im_end|>\n<|im_start|>assistant\n"
)
HAND_FINAL_PROMPT = (
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
    "You are presented with a problem and a previous memory. Please answer the problem based on the previous "
    "memory and put the answer in \\boxed{}.\n\n"
    "<problem> \nWhat is the special magic number for odd-tiger mentioned in the provided text?\n</problem>\n\n"
    "<memory>\nThe special magic number for odd-tiger is 4711.\n</memory>\n\n"
    "Your answer:\n<|im_end|>\n<|im_start|>assistant\n"
)


HAND_NEEDLE = "The special magic number for odd-tiger is 4711."
HAND_DOC = {  # one chunk: a filler sentence, the needle, another filler sentence
    "context": f"The farmer painted a tall tree. {HAND_NEEDLE} A small dog found the school.",
    "question": "What is the special magic number for odd-tiger mentioned in the provided text?",
    "needle": HAND_NEEDLE,
}


def test_the_naive_teacher_writes_the_papers_prompt_format(tokenizer):
    needle, doc = HAND_NEEDLE, HAND_DOC
    workflow = MemoryWorkflow(agent_config(), tokenizer)
    turns = teacher_transcript(workflow, doc, random.Random(0), p_needle=1.0)
    assert [kind for kind, _, _ in turns] == ["memory", "final"]
    (_, (prompt, target), text), (_, (final_prompt, final_target), final_text) = turns
    assert tokenizer.decode(prompt) == HAND_MEMORY_PROMPT
    assert text == needle and tokenizer.decode(target) == needle + "<|im_end|>"
    assert tokenizer.decode(final_prompt) == HAND_FINAL_PROMPT
    assert final_text == "\\boxed{4711}" and final_target[-1] == tokenizer.eos_token_id
    # Without the needle copied, the teacher writes the chunk's first complete sentence and guesses.
    turns = teacher_transcript(workflow, doc, random.Random(0), p_needle=0.0)
    assert turns[0][2] == "The farmer painted a tall tree."
    assert turns[1][2].startswith("\\boxed{") and turns[1][2] != "\\boxed{4711}"


def test_the_needle_tasks_teacher_writes_the_needle_a_quarter_of_the_time_by_default(tokenizer):
    """Recipe 5 (docs/replication_cpu_notebook.md, "The teacher's share of needles"): the needle task's teacher
    writes the needle when its draw is under 0.25, the choosing task's keeps 0.4. A draw between the two: the
    default writes the chunk's first sentence, p_needle 0.4 the needle; a draw under 0.25: the needle."""
    assert P_NEEDLE == {"needle": 0.25, "choose": 0.4}
    needle, doc = HAND_NEEDLE, HAND_DOC
    workflow = MemoryWorkflow(agent_config(), tokenizer)
    between = next(s for s in range(100) if 0.25 <= random.Random(s).random() < 0.4)
    under = next(s for s in range(100) if random.Random(s).random() < 0.25)
    assert teacher_transcript(workflow, doc, random.Random(between))[0][2] == "The farmer painted a tall tree."
    assert teacher_transcript(workflow, doc, random.Random(between), p_needle=0.4)[0][2] == needle
    assert teacher_transcript(workflow, doc, random.Random(under))[0][2] == needle


def test_the_cached_build_refuses_a_teacher_setting():
    """--cache builds the recipe as it is: --p-needle goes with --out (its default is the task's)."""
    from experiments.needle.warm_start.cli import checked, parser

    assert checked(parser(), ["--out", "x"]).p_needle is None
    with pytest.raises(SystemExit) as refused:
        checked(parser(), ["--cache", "--p-needle", "0.25"])
    assert refused.value.code == 2


def test_the_evaluation_drives_real_sessions_with_a_tiny_reader(tokenizer, tmp_path):
    from transformers import AutoModelForCausalLM

    from experiments.needle.warm_start import evaluate

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(reader_config(tokenizer, hidden=32, layers=1, heads=2, kv_heads=1))
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    result = evaluate(tmp_path, docs=2, chunks=(1, 2))
    for n in (1, 2):
        row = result["lengths"][n]
        assert row["failed"] == 0 and 0.0 <= row["strict"] <= 1.0
        assert len(row["example"]["memories"]) == n  # one memory per chunk, then the answer


def test_the_mod3_switch_splits_the_numbers_by_their_residue(monkeypatch):
    """NEEDLE_NUMBERS=mod3 (an experiment's switch): the numbers v with v % 3 the split's id, ascending."""
    monkeypatch.setenv("NEEDLE_NUMBERS", "mod3")
    # hand-computed: 1002 = 3 x 334 (train), 1000 = 3 x 333 + 1 (validation), 1001 = 3 x 333 + 2 (test)
    assert split_numbers("train")[:3] == [1002, 1005, 1008]
    assert split_numbers("validation")[:3] == [1000, 1003, 1006]
    assert split_numbers("test")[:3] == [1001, 1004, 1007] and split_numbers("test")[-1] == 9998
    assert all(len(split_numbers(s)) == 3000 for s in SPLITS)
    monkeypatch.setenv("NEEDLE_NUMBERS", "odd")
    with pytest.raises(ValueError, match="NEEDLE_NUMBERS='odd'"):
        split_numbers("train")


def test_the_teacher_that_writes_nothing_new_when_it_misses_the_needle():
    """needle_write with miss="memory": the needle (probability p_needle) on its chunk, else the memory as it was;
    a needle in memory always kept, whatever p_keep; an empty memory stays empty."""
    from experiments.needle.warm_start.teachers import needle_write

    doc = {"needle": "The special magic number for brave-otter is 1234."}
    with_needle = ["The pilot found a warm coat.", doc["needle"]]
    without = ["The mayor opened the school."]
    rng = random.Random(0)
    assert needle_write(doc, "", with_needle, rng, 1.0, 0.0, miss="memory") == doc["needle"]
    assert needle_write(doc, "", with_needle, rng, 0.0, 0.0, miss="memory") == ""
    assert needle_write(doc, "", without, rng, 1.0, 0.0, miss="memory") == ""
    assert needle_write(doc, doc["needle"], without, rng, 0.0, 0.0, miss="memory") == doc["needle"]
    # the default (miss="first"): the chunk's first filler sentence
    assert needle_write(doc, "", with_needle, rng, 0.0, 0.0) == "The pilot found a warm coat."
    assert needle_write(doc, doc["needle"], without, rng, 0.0, 0.0) == "The mayor opened the school."
    with pytest.raises(ValueError, match="unknown miss"):
        needle_write(doc, "", without, rng, 0.5, 0.5, miss="other")
