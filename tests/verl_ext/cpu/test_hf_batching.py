"""Batching of concurrent requests in the CPU token server (``verl_ext/cpu/hf_server.py``) and, through it, in
the ``hf_cpu`` rollout server: what a batched call returns is what each request gets alone, and the calls are
those the scripted arrivals imply.

No timing: a batch forms because requests are queued before the worker runs (``asyncio.gather`` starts every
request before the worker task it schedules) or while a gated call waits on an ``asyncio.Event``. The expected
values come from another route: the same requests served one at a time (``max_batch_size=1``), greedy decoding by
hand with full forward passes, and a wrapper around ``model.generate`` that records each call's rows.
"""

from __future__ import annotations

import asyncio
import contextlib
import random

import pytest
import torch

from verl_ext.cpu.hf_server import HFTokenServer

GREEDY = {"temperature": 0.0, "logprobs": True}


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture
def make_server(tiny_model_dir, tokenizer):
    """A server with its own copy of the tiny model; ``server.calls`` records each model.generate call."""

    def make(**kwargs) -> HFTokenServer:
        server = HFTokenServer(tiny_model_dir, tokenizer, **kwargs)
        server.calls = []
        generate = server.model.generate

        def recorded(*args, **kw):
            config, mask = kw["generation_config"], kw["attention_mask"]
            server.calls.append(
                {
                    "prompts": [row[keep.bool()].tolist() for row, keep in zip(kw["input_ids"], mask, strict=True)],
                    "sampling": (config.do_sample, config.temperature, config.top_p, config.top_k)
                    if config.do_sample
                    else (False,),
                    "repetition_penalty": config.repetition_penalty,
                    "max_new_tokens": config.max_new_tokens,
                    "prefill_chunk_size": config.prefill_chunk_size,
                }
            )
            return generate(*args, **kw)

        server.model.generate = recorded
        return server

    return make


def random_prompts(lengths: list[int], seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 500) for _ in range(n)] for n in lengths]


def greedy_by_hand(model, prompt: list[int], max_tokens: int, eos: set[int]) -> tuple[list[int], list[float]]:
    """Greedy decoding with a full forward pass per token (no cache, no padding) and its log-probs."""
    ids, tokens, log_probs = list(prompt), [], []
    with torch.no_grad():
        for _ in range(max_tokens):
            logits = model(torch.tensor([ids])).logits[0, -1].float()
            token = int(logits.argmax())
            tokens.append(token)
            log_probs.append(float(torch.log_softmax(logits, -1)[token]))
            ids.append(token)
            if token in eos:
                break
    return tokens, log_probs


def forward_logprobs(model, prompt: list[int], response: list[int], temperature: float) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + response])).logits[0].float()
    logits = logits[len(prompt) - 1 : len(prompt) + len(response) - 1] / temperature
    return torch.log_softmax(logits, dim=-1).gather(-1, torch.tensor(response).unsqueeze(-1)).squeeze(-1)


async def one_at_a_time(server, prompts, max_tokens, params):
    return [
        await server.generate(f"s{i}", prompt_ids=p, sampling_params={**params, "max_tokens": m})
        for i, (p, m) in enumerate(zip(prompts, max_tokens, strict=True))
    ]


async def together(server, prompts, max_tokens, params):
    return await asyncio.gather(
        *[
            server.generate(f"b{i}", prompt_ids=p, sampling_params={**params, "max_tokens": m})
            for i, (p, m) in enumerate(zip(prompts, max_tokens, strict=True))
        ]
    )


@pytest.mark.parametrize(("repetition_penalty", "prefill_chunk_size"), [(1.0, None), (1.0, 16), (1.3, 16)])
async def test_a_greedy_batch_matches_the_requests_served_one_at_a_time(
    make_server, repetition_penalty, prefill_chunk_size
):
    prompts = random_prompts([7, 23, 40, 58, 12, 31])
    max_tokens = [3, 9, 1, 12, 6, 8]
    params = {**GREEDY, "repetition_penalty": repetition_penalty}
    # The batch reads its 58-position prompts in one pass or in chunks of 16; a request alone, in one pass.
    single, batched = make_server(max_batch_size=1), make_server(prefill_chunk_size=prefill_chunk_size)
    alone = await one_at_a_time(single, prompts, max_tokens, params)
    batch = await together(batched, prompts, max_tokens, params)

    assert [c["prompts"] for c in single.calls] == [[p] for p in prompts]
    assert [c["prompts"] for c in batched.calls] == [prompts]  # one left-padded call, rows in arrival order
    assert batched.calls[0]["max_new_tokens"] == 12 and batched.generate_calls == 1 and batched.requests == 6
    assert batched.calls[0]["prefill_chunk_size"] == prefill_chunk_size
    assert {c["prefill_chunk_size"] for c in single.calls} == {None}
    eos = set(batched.eos_ids)
    for a, b, m in zip(alone, batch, max_tokens, strict=True):
        assert b.token_ids == a.token_ids
        assert len(b.token_ids) == m or (len(b.token_ids) < m and b.token_ids[-1] in eos)
        assert len(b.log_probs) == len(b.token_ids)
        assert torch.allclose(torch.tensor(b.log_probs), torch.tensor(a.log_probs), atol=1e-4)


async def test_batch_size_one_serves_each_request_unpadded_in_arrival_order(make_server):
    server = make_server(max_batch_size=1)
    prompts, max_tokens = random_prompts([5, 30, 17], seed=1), [4, 7, 2]
    outputs = await together(server, prompts, max_tokens, GREEDY)
    assert [c["prompts"] for c in server.calls] == [[p] for p in prompts]
    for prompt, m, out in zip(prompts, max_tokens, outputs, strict=True):
        tokens, log_probs = greedy_by_hand(server.model, prompt, m, set(server.eos_ids))
        assert out.token_ids == tokens
        assert torch.allclose(torch.tensor(out.log_probs), torch.tensor(log_probs), atol=1e-4)


async def test_a_sampled_batch_returns_the_temperature_scaled_logprobs_of_each_row(make_server):
    server = make_server()
    prompts, max_tokens = random_prompts([9, 33, 21], seed=2), [5, 3, 6]
    params = {"temperature": 0.7, "top_p": 1.0, "top_k": -1, "logprobs": True}
    outputs = await together(server, prompts, max_tokens, params)
    assert [len(c["prompts"]) for c in server.calls] == [3]
    eos = set(server.eos_ids)
    for prompt, m, out in zip(prompts, max_tokens, outputs, strict=True):
        assert 1 <= len(out.token_ids) <= m and (len(out.token_ids) == m or out.token_ids[-1] in eos)
        assert eos.isdisjoint(out.token_ids[:-1])
        expected = forward_logprobs(server.model, prompt, out.token_ids, temperature=0.7)
        assert torch.allclose(torch.tensor(out.log_probs), expected, atol=1e-4)


async def test_each_row_is_cut_after_its_own_eos(make_server):
    prompts, max_tokens = random_prompts([11, 26, 19], seed=3), [10, 10, 6]
    # Without an eos in reach, each row's greedy tokens (served one at a time)...
    reference = make_server(max_batch_size=1)
    reference.eos_ids = [reference.model.config.vocab_size + 7]  # an id no row can produce
    full = [o.token_ids for o in await one_at_a_time(reference, prompts, max_tokens, GREEDY)]
    # ...then an eos id that row 0 produces (not among its first two tokens) and row 1 never produces.
    eos = next(t for t in full[0][2:] if t not in full[1] and t not in full[0][:2])
    server = make_server()
    server.eos_ids = [eos]
    outputs = await together(server, prompts, max_tokens, GREEDY)
    assert len(server.calls) == 1
    for tokens, m, out in zip(full, max_tokens, outputs, strict=True):
        cut = tokens.index(eos) + 1 if eos in tokens else m  # by hand: through the first eos, else the budget
        assert out.token_ids == tokens[:cut] and len(out.log_probs) == cut
    assert outputs[0].token_ids[-1] == eos and len(outputs[1].token_ids) == 10  # row 1 ran on past row 0's eos


async def test_scripted_arrivals_make_the_calls_they_imply_and_never_mix_sampling(make_server):
    gate, entered = asyncio.Event(), asyncio.Event()

    @contextlib.asynccontextmanager
    async def gated():
        if not entered.is_set():  # the first call waits until the others are queued
            entered.set()
            await gate.wait()
        yield

    server = make_server(around_batch=gated)
    p = random_prompts([8 + 3 * i for i in range(12)], seed=4)
    warm = {"temperature": 0.9, "top_p": 0.95, "top_k": 20}
    first = asyncio.create_task(server.generate("a", prompt_ids=p[0], sampling_params={**GREEDY, "max_tokens": 2}))
    await entered.wait()
    arrivals = [  # queued, in this order, while the first call runs
        {**GREEDY, "max_tokens": 3},  # p[1]
        {**warm, "max_tokens": 2},  # p[2]
        {**GREEDY, "max_tokens": 4, "top_k": 5},  # p[3]: top_k does not matter to greedy decoding
        {**warm, "max_tokens": 2, "repetition_penalty": 1.2},  # p[4]
        {**warm, "max_tokens": 3, "seed": 11},  # p[5]
        {**warm, "max_tokens": 2},  # p[6]
        {**warm, "max_tokens": 2, "temperature": 0.5},  # p[7]
        {**warm, "max_tokens": 2, "top_p": 0.8},  # p[8]
        {**warm, "max_tokens": 2, "top_k": 10},  # p[9]
        {**warm, "max_tokens": 1, "temperature": 0.5},  # p[10]
        {"temperature": 0.7, "do_sample": False, "max_tokens": 2},  # p[11]: greedy
    ]
    rest = [
        asyncio.create_task(server.generate(f"r{i}", prompt_ids=p[i], sampling_params=params))
        for i, params in enumerate(arrivals, start=1)
    ]
    await asyncio.sleep(0)  # each task runs up to its wait: all are queued
    assert server.queued() == len(arrivals) and server.generate_calls == 0
    gate.set()
    await asyncio.gather(first, *rest)

    calls = [
        ([0], (False,), 1.0, 2),
        ([1, 3, 11], (False,), 1.0, 4),  # the oldest queued request's call takes every greedy request
        ([2, 6], (True, 0.9, 0.95, 20), 1.0, 2),
        ([4], (True, 0.9, 0.95, 20), 1.2, 2),
        ([5], (True, 0.9, 0.95, 20), 1.0, 3),  # seeded: alone
        ([7, 10], (True, 0.5, 0.95, 20), 1.0, 2),
        ([8], (True, 0.9, 0.8, 20), 1.0, 2),
        ([9], (True, 0.9, 0.95, 10), 1.0, 2),
    ]
    made = [(c["prompts"], c["sampling"], c["repetition_penalty"], c["max_new_tokens"]) for c in server.calls]
    assert made == [([p[i] for i in rows], *rest) for rows, *rest in calls]
    assert server.generate_calls == len(calls) and server.requests == 12 and server.queued() == 0


async def test_a_seeded_request_runs_alone_and_keeps_its_seeded_result(make_server):
    prompts = random_prompts([10, 24, 16, 30], seed=5)
    sampled = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True, "max_tokens": 6}
    seeded = {**sampled, "seed": 1234}
    server = make_server()
    outputs = await asyncio.gather(
        *[
            server.generate(str(i), prompt_ids=p, sampling_params=seeded if i == 1 else sampled)
            for i, p in enumerate(prompts)
        ]
    )
    # The oldest request's call takes the other unseeded ones; the seeded one gets its own call.
    assert [c["prompts"] for c in server.calls] == [[prompts[0], prompts[2], prompts[3]], [prompts[1]]]
    alone = make_server(max_batch_size=1)
    again = await alone.generate("x", prompt_ids=prompts[1], sampling_params=seeded)
    assert outputs[1].token_ids == again.token_ids
    assert torch.allclose(torch.tensor(outputs[1].log_probs), torch.tensor(again.log_probs), atol=1e-5)


async def test_max_batch_size_caps_a_call(make_server):
    server = make_server(max_batch_size=2)
    prompts = random_prompts([6, 9, 12, 15, 18], seed=6)
    await together(server, prompts, [2] * 5, GREEDY)
    assert [c["prompts"] for c in server.calls] == [prompts[0:2], prompts[2:4], prompts[4:5]]
    with pytest.raises(ValueError, match="max_batch_size"):
        make_server(max_batch_size=0)


async def test_a_failed_call_fails_its_requests_only(make_server):
    server = make_server()
    generate = server.model.generate

    def fail_on_the_first_call(*args, **kwargs):
        if server.generate_calls == 1:
            raise RuntimeError("boom")
        return generate(*args, **kwargs)

    server.model.generate = fail_on_the_first_call
    prompts = random_prompts([6, 9], seed=7)
    failed, sampled = await asyncio.gather(
        server.generate("f", prompt_ids=prompts[0], sampling_params={**GREEDY, "max_tokens": 2}),
        server.generate("s", prompt_ids=prompts[1], sampling_params={"temperature": 1.0, "max_tokens": 2}),
        return_exceptions=True,
    )
    assert isinstance(failed, RuntimeError) and str(failed) == "boom"
    assert 1 <= len(sampled.token_ids) <= 2 and server.generate_calls == 2 and server.requests == 1


# ------------------------------------------------------------------------------------------------------------
# the hf_cpu rollout server: batches under the model lock


@pytest.fixture
def rollout_server(tiny_model_dir):
    from verl.workers.config import HFModelConfig, RolloutConfig

    from verl_ext.cpu.rollout.server import HFCPUServer

    def make(**config):
        rollout = RolloutConfig(
            name="hf_cpu",
            prompt_length=64,
            response_length=16,
            max_model_len=80,
            tensor_model_parallel_size=1,
            **config,
        )
        return HFCPUServer(rollout, HFModelConfig(path=tiny_model_dir), replica_rank=0)

    return make


async def test_rollout_server_batches_up_to_max_num_seqs(rollout_server):
    assert rollout_server(max_num_seqs=1).engine.max_batch_size == 1
    server = rollout_server(max_num_seqs=3)
    prompts = random_prompts([5, 9, 13, 17], seed=8)
    outputs = await together(server, prompts, [4] * 4, GREEDY)
    assert (await server.stats())["generate_calls"] == 2 and (await server.stats())["requests"] == 4
    single = rollout_server(max_num_seqs=1)
    alone = await one_at_a_time(single, prompts, [4] * 4, GREEDY)
    assert [o.token_ids for o in outputs] == [o.token_ids for o in alone]
    assert (await single.stats())["generate_calls"] == 4


async def test_a_weight_update_waits_for_the_running_call_and_queued_requests_get_the_new_weights(rollout_server):
    server = rollout_server()
    prompt = random_prompts([12], seed=9)[0]
    params = {**GREEDY, "max_tokens": 6}
    old_tokens = (await server.generate("o", prompt_ids=prompt, sampling_params=params)).token_ids
    generator = torch.Generator().manual_seed(0)
    new_weights = {
        name: p.detach() + 0.5 * torch.randn(p.shape, generator=generator)
        for name, p in server.model.named_parameters()
    }

    gate, entered = asyncio.Event(), asyncio.Event()
    serving = server.engine.around_batch

    @contextlib.asynccontextmanager
    async def gated():
        async with serving():  # the model lock is held from here
            if not entered.is_set():
                entered.set()
                await gate.wait()
            yield

    server.engine.around_batch = gated
    running = asyncio.create_task(server.generate("a", prompt_ids=prompt, sampling_params=params))
    await entered.wait()
    update = asyncio.create_task(server.update_weights(new_weights, global_steps=3))
    queued = asyncio.create_task(server.generate("b", prompt_ids=prompt, sampling_params=params))
    await asyncio.sleep(0)
    assert server.weight_updates == 0 and server.engine.queued() == 1  # the update waits for the running call
    gate.set()
    before, _, after = await asyncio.gather(running, update, queued)

    assert before.token_ids == old_tokens and before.extra_fields["global_steps"] == 0
    assert after.extra_fields["global_steps"] == 3
    server.engine.around_batch = serving
    fresh = await server.generate("c", prompt_ids=prompt, sampling_params=params)  # the new weights, alone
    assert after.token_ids == fresh.token_ids != old_tokens
