"""Needle-in-a-haystack memory-agent transcripts in the paper's prompts (probe data, not the training set).

A document is 1..N chunks of filler sentences (each chunk <= ``chunk_tokens`` tokens, sentence-aligned);
one chunk holds the needle "The special magic number for KEY is NNNN.". Each transcript is the sequence of
memory-update turns (MEMORY_TEMPLATE) and a final turn (FINAL_TEMPLATE_BOXED), as chat rows
(prompt ids, target ids). Two teachers write the targets:

- ``oracle``: memory = the needle sentence once seen (else "No relevant information."); final = \\boxed{NNNN}.
- ``naive``: memory = one sentence copied from the chunk; the needle with probability ``p_needle`` when
  present, else a random filler sentence; a needle already in memory is kept with probability ``p_keep``
  on chunks without the needle. Final = \\boxed{number in memory}, or a random 4-digit guess.
"""

from __future__ import annotations

import random
import re

from recurrent.impls.memory import FINAL_TEMPLATE_BOXED, MEMORY_TEMPLATE, NO_MEMORY, render

ADJ = (
    "brave calm dark eager fancy gentle happy icy jolly kind lazy mighty noisy odd proud quick rapid shy "
    "silly tall vast warm young zany bold bright cold dry early fair grand hollow"
).split()
NOUN = (
    "otter heron falcon tiger lemon river castle garden pencil rocket violin wizard anchor badger candle "
    "dragon engine forest glacier harbor island jungle kettle ladder meadow needle orchard planet"
).split()
SUBJ = (
    "The farmer|The old man|A young girl|The teacher|My neighbor|The doctor|A small dog|The captain|"
    "The baker|Her brother|The children|The mayor|A tired student|The pilot|Our guide"
).split("|")
VERB = (
    "walked to|looked at|painted|carried|talked about|found|visited|cleaned|bought|forgot|repaired|"
    "watched|opened|remembered|described"
).split("|")
OBJ = (
    "the red barn|a quiet lake|the long road|an empty box|the wooden table|a tall tree|the city market|"
    "the blue house|a broken clock|the stone bridge|a warm coat|the green field|an old map|the school|"
    "a heavy bag|the morning train"
).split("|")
TAIL = (
    "|in the morning|after lunch|before the rain|with great care|for a long time|on Sunday|near the hill|"
    "without a word|again and again|at noon"
).split("|")

NEEDLE = "The special magic number for {key} is {value}."
QUESTION = "What is the special magic number for {key} mentioned in the provided text?"
EMPTY_MEMORY = "No relevant information."
NEEDLE_RE = re.compile(r"The special magic number for (\S+) is (\d+)\.")
BOXED_RE = re.compile(r"\\boxed\{(\d+)\}")


def filler_sentence(rng: random.Random) -> str:
    tail = rng.choice(TAIL)
    return f"{rng.choice(SUBJ)} {rng.choice(VERB)} {rng.choice(OBJ)}{' ' + tail if tail else ''}."


def make_doc(rng: random.Random, tok, n_chunks: int, chunk_tokens: int = 64) -> dict:
    """Chunks of filler (sentence-aligned, <= chunk_tokens each); the needle inserted into one chunk."""
    key = f"{rng.choice(ADJ)}-{rng.choice(NOUN)}"
    value = str(rng.randint(1000, 9999))
    needle = NEEDLE.format(key=key, value=value)
    needle_chunk = rng.randrange(n_chunks)
    chunks = []
    for c in range(n_chunks):
        sents: list[str] = []
        budget = chunk_tokens
        if c == needle_chunk:
            budget -= len(tok(" " + needle).input_ids)
        while True:
            s = filler_sentence(rng)
            if len(tok(" ".join([*sents, s])).input_ids) > budget:
                break
            sents.append(s)
        if c == needle_chunk:
            sents.insert(rng.randint(0, len(sents)), needle)
        chunks.append(sents)
    return {"key": key, "value": value, "needle": needle, "needle_chunk": needle_chunk, "chunks": chunks}


def teacher_turns(doc: dict, rng: random.Random, teacher: str, p_needle: float = 0.5, p_keep: float = 0.9):
    """[(kind, prompt_text, target_text)] for one document."""
    question = QUESTION.format(key=doc["key"])
    memory = NO_MEMORY
    turns = []
    for sents in doc["chunks"]:
        chunk = " ".join(sents)
        prompt = render(MEMORY_TEMPLATE, prompt=question, memory=memory, chunk=chunk)
        has_needle = doc["needle"] in sents
        mem_has = doc["needle"] == memory
        if teacher == "oracle":
            new = doc["needle"] if (has_needle or mem_has) else EMPTY_MEMORY
        else:
            fillers = [s for s in sents if s != doc["needle"]]
            if has_needle and rng.random() < p_needle:
                new = doc["needle"]
            elif mem_has and not has_needle and rng.random() < p_keep:
                new = memory
            else:
                new = rng.choice(fillers)
        turns.append(("memory", prompt, new))
        memory = new
    final = render(FINAL_TEMPLATE_BOXED, prompt=question, memory=memory)
    m = NEEDLE_RE.search(memory)
    answer = m.group(2) if m else str(rng.randint(1000, 9999))
    turns.append(("final", final, f"\\boxed{{{answer}}}"))
    return turns


def encode_turn(tok, prompt: str, target: str) -> tuple[list[int], list[int]]:
    """Chat-formatted prompt ids (with generation prompt) and target ids (+ eos)."""
    p = tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True)
    pid = tok(p, add_special_tokens=False).input_ids
    tid = tok(target, add_special_tokens=False).input_ids + [tok.eos_token_id]
    return pid, tid


def vocab_ids(tok) -> list[int]:
    """Every token id the task can produce: prompts, chat template, all filler/key words, digits, specials."""
    ids: set[int] = set(tok.all_special_ids)
    texts = [MEMORY_TEMPLATE, FINAL_TEMPLATE_BOXED, NO_MEMORY, EMPTY_MEMORY, QUESTION, NEEDLE, "\\boxed{1234}"]
    texts += [f"{a}-{n}" for a in ADJ for n in NOUN]
    texts += SUBJ + VERB + OBJ + TAIL + [str(d) for d in range(10)]
    texts.append(
        tok.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False, add_generation_prompt=True)
    )
    for t in texts:
        for variant in (t, " " + t, t + ".", "\n" + t):
            ids.update(tok(variant, add_special_tokens=False).input_ids)
    return sorted(ids)
