"""The sync lockstep loop and the in-process HF backend, on the tiny model.

The tiny model's random init is so flat that greedy decoding emits one token forever; these tests re-draw its
weights with a larger scale (fixed seed) so that greedy outputs depend on the prompt and memories differ.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from verl import DataProto

from recurrent.backends.hf import HFBackend
from recurrent.interface import Reply, Session, Turn, TurnRecord
from recurrent.padding import pad_tensor_list_to_length, position_ids_from_mask, strip_tokens
from recurrent.sync_manager import SessionBatchAgent, SyncGenerationManager
from recurrent.templating import chat_prompt_template, chat_token_template

MEMORY_TEMPLATE = "Sample {sample} step {step}.\n<memory>\n{memory}\n</memory>\nUpdated memory:\n"
FINAL_TEMPLATE = "Sample {sample}, answer in \\boxed{{}}.\n<memory>\n{memory}\n</memory>\nYour answer:\n"
NO_MEMORY = "No previous memory"
MEMORY_TOKENS, FINAL_TOKENS = 6, 4
NON_FINAL_TURNS = [2, 1, 3, 1]  # the spec's diagram: s1 2 turns, s2 1, s3 3, s4 1, then all finals
EXPECTED_SAMPLE_INDEX = [0, 1, 2, 3, 0, 2, 2, 0, 1, 2, 3]
EXPECTED_FINAL_MASK = [False] * 7 + [True] * 4


# --- a toy workflow --------------------------------------------------------------------------------------


class ToySession(Session):
    """k memory turns (the memory is the last reply's ids, pad and eos stripped), then one final turn."""

    def __init__(self, sample: dict, tok, carry_memory: bool = True):
        self.tok = tok
        self.index = sample["index"]
        self.turns = sample["turns"]
        self.carry_memory = carry_memory
        self.memory_tt = chat_token_template(tok, MEMORY_TEMPLATE)
        self.final_tt = chat_token_template(tok, FINAL_TEMPLATE)
        self._history: list[TurnRecord] = []
        self._turn: Turn | None = None

    def _ids(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False)

    def next_turn(self) -> Turn | None:
        step = len(self._history)
        if step > self.turns:
            return None
        memory = self._ids(NO_MEMORY)
        if self._history and self.carry_memory:
            memory = strip_tokens(self._history[-1].reply.token_ids, [self.tok.pad_token_id, self.tok.eos_token_id])
        values = {"sample": str(self.index), "memory": self.tok.decode(memory)}
        final = step == self.turns
        if not final:
            values["step"] = str(step + 1)
        template, tt = (FINAL_TEMPLATE, self.final_tt) if final else (MEMORY_TEMPLATE, self.memory_tt)
        ids = {k: (memory if k == "memory" else self._ids(v)) for k, v in values.items()}
        self._turn = Turn(
            messages=[{"role": "user", "content": render(template, values)}],
            max_tokens=FINAL_TOKENS if final else MEMORY_TOKENS,
            prompt_ids=tt.format(**ids),
            final=final,
            meta={"sample": self.index, "step": step},
        )
        return self._turn

    def record(self, reply: Reply) -> None:
        self._history.append(TurnRecord(self._turn, reply))

    @property
    def history(self) -> list[TurnRecord]:
        return self._history


def render(template: str, values: dict[str, str]) -> str:
    for key, text in values.items():
        template = template.replace("{" + key + "}", text)
    return template


def batch_of(turns: list[int]) -> list[dict]:
    return [{"index": i, "turns": k} for i, k in enumerate(turns)]


class RecordingBackend:
    """Wraps a backend and keeps every batch it was asked to generate."""

    def __init__(self, inner):
        self.inner = inner
        self.calls: list[DataProto] = []

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        self.calls.append(prompts)
        return self.inner.generate_sequences(prompts)


# --- fixtures --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    return model


@pytest.fixture(scope="module")
def batched(model, tok):
    return HFBackend((model, tok), batched=True)


@pytest.fixture(scope="module")
def unbatched(model, tok):
    return HFBackend((model, tok), batched=False)


@pytest.fixture(scope="module")
def eos_ids(tok, unbatched):
    """<|im_end|> plus a token the model emits early on sample 0's first turn, so that some rows stop."""
    session = ToySession({"index": 0, "turns": 1}, tok)
    turn = session.next_turn()
    out = unbatched.generate_sequences(make_batch([turn.prompt_ids], tok, max_tokens=MEMORY_TOKENS))
    return [tok.eos_token_id, int(out.batch["responses"][0, 2])]


def make_batch(prompts, tok, **meta) -> DataProto:
    ids, mask = pad_tensor_list_to_length([torch.tensor(p) for p in prompts], tok.pad_token_id, return_mask=True)
    tensors = {"input_ids": ids, "attention_mask": mask.long(), "position_ids": position_ids_from_mask(mask)}
    return DataProto.from_dict(tensors=tensors, meta_info=meta)


def run(backend, tok, turns=NON_FINAL_TURNS, world_size=1, eos=None, carry_memory=True, **kwargs):
    manager = SyncGenerationManager(backend, tok, world_size=world_size, **kwargs)
    agent = SessionBatchAgent(lambda sample: ToySession(sample, tok, carry_memory))
    return manager.run(agent, batch_of(turns), generation_kwargs={"eos_token_id": eos} if eos else None)


@pytest.fixture(scope="module")
def rollout(unbatched, tok, eos_ids):
    return run(unbatched, tok, eos=eos_ids, input_pad_to=8)


def rows_in_order(rollout):
    """(sample, turn number) of every row, read off the sessions' histories in turn-major order."""
    seen = [0] * len(rollout.sessions)
    out = []
    for s in rollout.sample_index.tolist():
        out.append((s, seen[s]))
        seen[s] += 1
    return out


# --- the lockstep order ----------------------------------------------------------------------------------


def test_turn_major_order_matches_the_spec_diagram(rollout):
    assert len(rollout.rows) == 11
    assert rollout.final_mask.dtype == torch.bool and rollout.sample_index.dtype == torch.long
    assert rollout.final_mask.tolist() == EXPECTED_FINAL_MASK
    assert rollout.sample_index.tolist() == EXPECTED_SAMPLE_INDEX
    assert [r["rows"] for r in rollout.timings] == [4, 2, 1, 4]
    assert [r["final"] for r in rollout.timings] == [False, False, False, True]
    assert [r["max_tokens"] for r in rollout.timings] == [6, 6, 6, 4]
    assert set(rollout.timing_totals()) == {"mt_prepare", "mt_gen", "mt_update"}
    assert [len(s.history) for s in rollout.sessions] == [k + 1 for k in NON_FINAL_TURNS]


def test_each_row_prompt_is_its_turn_prompt(rollout, tok):
    batch = rollout.rows.batch
    width = batch["prompts"].shape[1]
    for row, (s, t) in enumerate(rows_in_order(rollout)):
        record = rollout.sessions[s].history[t]
        prompt = batch["prompts"][row][batch["attention_mask"][row, :width].bool()].tolist()
        assert prompt == record.turn.prompt_ids
        assert record.turn.final == bool(rollout.final_mask[row])
        expected_text = chat_prompt_template(tok).replace("{message}", record.turn.messages[0]["content"])
        assert tok.decode(prompt) == expected_text


def test_memory_is_carried_from_the_previous_reply(rollout, tok):
    # Sample 2 has three memory turns: each prompt holds the previous reply's ids, pads and eos stripped.
    history = rollout.sessions[2].history
    for before, after in zip(history, history[1:], strict=False):
        memory = strip_tokens(before.reply.token_ids, [tok.pad_token_id, tok.eos_token_id])
        assert tok.decode(memory) in after.turn.messages[0]["content"]
    # Braces that are not slots stay literal on the token path (this test's own template; the shipped prompt
    # with "\\boxed{{}}" is checked token by token in test_memory_agent.py).
    assert "\\boxed{{}}" in history[-1].turn.messages[0]["content"]


def test_padding_and_masks_are_consistent(rollout, tok, eos_ids):
    b = rollout.rows.batch
    pad = tok.pad_token_id
    prompt_width, response_width = b["prompts"].shape[1], b["responses"].shape[1]
    lengths = [len(rollout.sessions[s].history[t].turn.prompt_ids) for s, t in rows_in_order(rollout)]
    assert prompt_width == max(8, *lengths)
    assert response_width == MEMORY_TOKENS  # the max max_tokens over rounds; the final round is re-padded
    assert torch.equal(b["input_ids"], torch.cat([b["prompts"], b["responses"]], dim=1))
    assert torch.equal(b["attention_mask"][:, prompt_width:], b["response_mask"])
    finish = []
    for row, (s, t) in enumerate(rows_in_order(rollout)):
        n = lengths[row]
        prompt_mask = b["attention_mask"][row, :prompt_width].tolist()
        assert prompt_mask == [0] * (prompt_width - n) + [1] * n  # zero exactly on the left pads
        assert b["prompts"][row, : prompt_width - n].eq(pad).all()
        mask = b["response_mask"][row].tolist()
        length = sum(mask)
        assert mask == [1] * length + [0] * (response_width - length)
        assert b["responses"][row, length:].eq(pad).all()
        response = b["responses"][row, :length].tolist()
        reply = rollout.sessions[s].history[t].reply
        assert reply.token_ids == response
        assert reply.completion_tokens == length and reply.prompt_tokens == n
        assert reply.text == tok.decode(response, skip_special_tokens=True)
        assert not any(tok_id in eos_ids for tok_id in response[:-1])  # the mask ends at the first eos
        if reply.finish_reason == "stop":
            assert response[-1] in eos_ids
        else:
            assert length == (FINAL_TOKENS if rollout.final_mask[row] else MEMORY_TOKENS)
        finish.append(reply.finish_reason)
        positions = b["position_ids"][row, prompt_width - n :].tolist()
        assert positions == list(range(n + response_width))  # real prompt tokens count from 0, then continue
    assert "stop" in finish and "length" in finish


def test_world_size_padding_is_removed_exactly(rollout, unbatched, tok, eos_ids):
    recorder = RecordingBackend(unbatched)
    padded = run(recorder, tok, world_size=3, eos=eos_ids, input_pad_to=8)
    assert [len(c) for c in recorder.calls] == [6, 3, 3, 6]  # 4, 2, 1, 4 real rows, padded to multiples of 3
    hello = tok.apply_chat_template([{"role": "user", "content": "Hello."}], add_generation_prompt=True, tokenize=False)
    first = recorder.calls[0].batch  # graceful_padding(4, 3): [0, 1, -1, 2, -1, 3]
    for slot in (2, 4):
        assert tok.decode(first["input_ids"][slot][first["attention_mask"][slot].bool()]) == hello
    assert torch.equal(padded.final_mask, rollout.final_mask)
    assert torch.equal(padded.sample_index, rollout.sample_index)
    for key in ("prompts", "responses", "response_mask", "attention_mask", "position_ids"):
        assert torch.equal(padded.rows.batch[key], rollout.rows.batch[key]), key


# --- the backend -----------------------------------------------------------------------------------------


def test_batched_and_unbatched_agree_on_equal_length_rows(batched, unbatched, tok):
    # Without carried memory every prompt of a round has the same length: no padding inside a round.
    one = run(batched, tok, carry_memory=False)
    two = run(unbatched, tok, carry_memory=False)
    assert torch.equal(one.rows.batch["responses"], two.rows.batch["responses"])
    replies = [[(r.reply.token_ids, r.reply.text) for r in s.history] for s in one.sessions]
    assert replies == [[(r.reply.token_ids, r.reply.text) for r in s.history] for s in two.sessions]
    assert len({tuple(r.reply.token_ids) for s in one.sessions for r in s.history}) > 1  # not all alike


def test_unbatched_equals_a_plain_single_row_generate(model, tok, unbatched):
    prompts = [tok.encode(text, add_special_tokens=False) for text in ("hello world", "what is the answer")]
    out = unbatched.generate_sequences(make_batch(prompts, tok, max_tokens=5, pad_to=7))
    for row, prompt in enumerate(prompts):
        ids = torch.tensor([prompt])
        plain = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=5, do_sample=False,
                               eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)  # fmt: skip
        new = plain[0, len(prompt) :].tolist()
        assert out.batch["responses"][row].tolist() == new + [tok.pad_token_id] * (7 - len(new))


def test_backend_output_shape_and_eos(unbatched, tok):
    prompts = [tok.encode("hello world", add_special_tokens=False), tok.encode("abc", add_special_tokens=False)]
    free = unbatched.generate_sequences(make_batch(prompts, tok, max_tokens=6, pad_to=9))
    assert free.batch["responses"].shape == (2, 9)
    assert free.batch["response_mask"].sum(dim=1).tolist() == [6, 6]  # no eos: all 6, never the padding
    stop = int(free.batch["responses"][0, 3])  # make row 0's 4th token an eos
    first = free.batch["responses"][0].tolist().index(stop)
    out = unbatched.generate_sequences(make_batch(prompts, tok, max_tokens=6, pad_to=9, eos_token_id=[2, stop]))
    assert out.batch["response_mask"][0].tolist() == [1] * (first + 1) + [0] * (8 - first)
    assert out.batch["responses"][0, first + 1 :].eq(tok.pad_token_id).all()
    for key in ("prompts", "responses", "response_mask", "input_ids", "attention_mask", "position_ids"):
        assert out.batch[key].shape[0] == 2
    assert out.batch["input_ids"].shape[1] == out.batch["prompts"].shape[1] + 9
    assert out.meta_info["max_tokens"] == 6
    with pytest.raises(ValueError, match="pad_to"):
        unbatched.generate_sequences(make_batch(prompts, tok, max_tokens=6, pad_to=5))


# --- errors ----------------------------------------------------------------------------------------------


class NoIdsSession(ToySession):
    def next_turn(self):
        turn = super().next_turn()
        if turn is not None:
            turn.prompt_ids = None
        return turn


class EarlyFinalSession(ToySession):
    """Flags its first turn final, then asks more turns: the reward row would not be the last."""

    def next_turn(self):
        turn = super().next_turn()
        if turn is not None and not self._history and self.turns > 0:
            turn.final = True
        return turn


class OddBudgetSession(ToySession):
    def next_turn(self):
        turn = super().next_turn()
        if turn is not None and self.index == 1:
            turn.max_tokens = 3
        return turn


@pytest.mark.parametrize(
    "session_cls, error, match",
    [
        (NoIdsSession, ValueError, "prompt_ids"),
        (OddBudgetSession, ValueError, r"max_tokens, got \[3, 6\]"),
        (EarlyFinalSession, AssertionError, "flagged final is not the last row"),
    ],
)
def test_agent_errors(unbatched, tok, session_cls, error, match):
    manager = SyncGenerationManager(unbatched, tok)
    agent = SessionBatchAgent(lambda sample: session_cls(sample, tok))
    with pytest.raises(error, match=match):
        manager.run(agent, batch_of([1, 1]))


def test_pad_to_smaller_than_max_tokens_is_refused(unbatched, tok):
    with pytest.raises(ValueError, match="pad_to"):
        run(unbatched, tok, turns=[1], pad_to=MEMORY_TOKENS - 1)


def test_sampling_follows_meta_and_seed(batched, tok):
    prompts = [tok.encode("hello world", add_special_tokens=False)] * 3
    meta = {"max_tokens": 8, "do_sample": True, "temperature": 1.0, "top_p": 1.0, "seed": 7}
    one = batched.generate_sequences(make_batch(prompts, tok, **meta)).batch["responses"]
    two = batched.generate_sequences(make_batch(prompts, tok, **meta)).batch["responses"]
    assert torch.equal(one, two)  # a seed in meta_info makes sampling reproducible
    assert len({tuple(r) for r in one.tolist()}) > 1  # and it does sample: identical prompts, different rows
