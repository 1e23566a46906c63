"""The step cost model (verl_ext/cost.py, cost_report.py): the memory agent's calls (its registration's
step_shapes, recurrent/impls/memory_cost.py), verl's micro-batches, and the tokens and FLOP of each phase of a tiny
step, against counts made by hand or by the real parts (the memory agent's own session, verl's own micro-batch
cutter, the tokenizer); an agent of a test's own through its registration alone, and one without a cost model."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from recurrent.async_manager import run_session
from recurrent.flops import ModelShape
from recurrent.impls.memory import MemoryConfig, MemoryWorkflow
from recurrent.impls.memory_cost import Generated, TemplateLengths, memory_agent_turns, template_lengths
from recurrent.interface import Reply, Turn
from recurrent.step_shapes import CallShape
from verl_ext import cost_report
from verl_ext.cost import PHASES, Cluster, Device, micro_batches, step_cost
from verl_ext.plan import compose

BUDGETS = SimpleNamespace(chunk_size=64, max_chunks=4)
TEMPLATES = TemplateLengths(memory=200, final=100, no_memory=3, source="by hand")
GENERATED = Generated(memory=16, answer=8, source="by hand")


def test_memory_agent_turns_by_hand():
    # 150 tokens: chunks of 64, 64 and 22; the first memory turn reads "No previous memory" (3), the others the
    # 16-token memory; the final turn the template, the question (10) and the memory.
    turns = memory_agent_turns(150, 10, BUDGETS, TEMPLATES, GENERATED)
    assert [(t.prompt, t.response) for t in turns] == [
        (200 + 10 + 64 + 3, 16),
        (200 + 10 + 64 + 16, 16),
        (200 + 10 + 22 + 16, 16),
        (100 + 10 + 16, 8),
    ]
    # 1000 tokens are centre-truncated to 4 x 64: four full chunks, then the answer.
    long = memory_agent_turns(1000, 10, BUDGETS, TEMPLATES, GENERATED)
    assert [t.prompt for t in long] == [277, 290, 290, 290, 126]
    # No context: the answer turn alone, from "No previous memory".
    assert memory_agent_turns(0, 10, BUDGETS, TEMPLATES, GENERATED) == [CallShape(100 + 10 + 3, 8)]


@pytest.mark.parametrize("context_tokens", [40, 60])  # 3 chunks of 16, 16, 8; 60 is centre-truncated to 48
def test_the_turns_are_the_memory_agents_own(tiny_tokenizer, context_tokens):
    """The memory agent, answered with scripted replies of the modelled lengths, builds prompts of exactly the
    modelled lengths."""
    config = MemoryConfig(
        chunk_size=16, max_chunks=3, max_memorization_length=5, max_final_response_length=4, max_prompt_length=32
    )
    episode = MemoryWorkflow(config, tiny_tokenizer).episode_from_ids(
        "What is the key?", np.arange(100, 100 + context_tokens)
    )
    seen = []

    class Capped:  # every reply its call's whole budget, no end token: cut at the cap
        async def send_turn(self, turn: Turn, **_) -> Reply:
            seen.append(CallShape(len(turn.prompt_ids), turn.max_tokens))
            return Reply("x", "length", token_ids=list(range(20, 20 + turn.max_tokens)))

    asyncio.run(run_session(episode, Capped()))
    templates = template_lengths(MemoryWorkflow(config, tiny_tokenizer))
    question_tokens = len(episode.reading.question_ids)
    modelled = memory_agent_turns(context_tokens, question_tokens, config, templates, Generated(5, 4, ""))
    assert seen == modelled and len(seen) == 4


def test_micro_batches_are_verls_own():
    from tensordict import TensorDict
    from verl.utils.seqlen_balancing import rearrange_micro_batches

    lengths = [300, 250, 200, 180, 120, 90, 60, 40, 500, 10]
    mask = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    batch = TensorDict({"input_ids": torch.zeros_like(mask), "attention_mask": mask}, batch_size=[len(lengths)])
    _, parts = rearrange_micro_batches(batch, max_token_len=600)
    verls = sorted(sorted(lengths[i] for i in part) for part in parts)
    ours = sorted(sorted(mb) for mb in micro_batches([lengths], 600)[0])
    assert ours == verls
    assert len(ours) >= 3 and all(sum(mb) <= 600 for mb in ours)  # 1,750 tokens: at least ceil(1750 / 600) = 3


def test_micro_batch_counts_agree_across_ranks_and_static_sizes_cut_runs():
    # Rank 0 needs 3 micro-batches of 600 tokens; rank 1 fits in 1, but verl gives every rank the largest count.
    cut = micro_batches([[500, 500, 500], [100, 100, 100]], 600)
    assert [len(rank) for rank in cut] == [3, 3]
    assert sorted(map(sorted, cut[1])) == [[100], [100], [100]]
    # Static micro-batches: contiguous runs of that many rows.
    assert micro_batches([[1, 2, 3, 4, 5]], None, rows=2) == [[[1, 2], [3, 4], [5]]]
    with pytest.raises(ValueError, match="a row of 700 tokens exceeds the micro-batch budget of 600 tokens"):
        micro_batches([[700]], 600)


def tiny_step(tiny_model_dir, overrides: list[str], agent: str | None = None, **args):
    """tiny_cpu: 2 prompts x n 2, one prompt per update (2 updates), 2 ranks; documents of 150 tokens, questions of
    10, memory 16 and answer 8 (the caps). ``agent``: another agent (its file), with its default settings."""
    config = compose(
        "tiny_cpu",
        [
            f"actor_rollout_ref.model.path={tiny_model_dir}",
            "data.train_batch_size=2",
            "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=1",
            *overrides,
        ],
    )
    if agent is not None:  # set after composing: tiny_cpu's budgets interpolate the memory agent's settings
        config.recurrent.agent, config.recurrent.config = agent, {}
    namespace = cost_report.default_args(context_tokens=150, question_tokens=10, **args)
    inputs = cost_report.CostInputs(config, namespace)
    unit = Cluster(Device("unit", 1.0, 1e30), 2, dict.fromkeys(PHASES, 1.0))
    return inputs, step_cost(config, inputs.shape, inputs.trajectories(), unit)


def test_tokens_and_flop_of_a_tiny_step_by_hand(tiny_model_dir, tiny_tokenizer):
    inputs, cost = tiny_step(tiny_model_dir, ["actor_rollout_ref.model.use_remove_padding=true"])
    no_memory = len(tiny_tokenizer.encode("No previous memory", add_special_tokens=False))
    # The tiny tokenizer's templates: 211 tokens around a memory turn, 111 around the answer (configs/tiny_cpu.yaml).
    sources = dict(inputs.shapes.sources)
    assert sources["templates"] == "memory turn 211, final turn 111 tokens (counted with the model's tokenizer)"
    prompts = [211 + 10 + 64 + no_memory, 211 + 10 + 64 + 16, 211 + 10 + 22 + 16, 111 + 10 + 16]
    assert inputs.trajectories() == [[CallShape(p, 16) for p in prompts[:3]] + [CallShape(prompts[3], 8)]] * 2
    lengths = [prompts[0] + 16, prompts[1] + 16, prompts[2] + 16, prompts[3] + 8]
    # 2 prompts x 2 trajectories x 4 turns.
    assert (cost.rows, cost.trajectories) == (16, 4)
    tokens = 4 * sum(lengths)
    # The tiny model: hidden 64, 2 layers, 4 heads of 16, 2 KV heads, intermediate 128, vocabulary 4096 (tied).
    # Weights per token: 2 x (q, o 2 x 64 x 64 + k, v 2 x 64 x 32 + MLP 3 x 64 x 128 = 36,864) + head 64 x 4096
    # = 335,872: 671,744 FLOP a token; attention 4 x 2 layers x 4 x 16 = 512 FLOP a pair, L(L+1)/2 pairs a row.
    flops = 4 * sum(671_744 * n + 512 * n * (n + 1) // 2 for n in lengths)
    for name in ("old_log_prob", "ref"):
        phase = cost.phases[name]
        assert (phase.tokens, phase.computed_tokens, phase.flops) == (tokens, tokens, flops)
        # The slower rank's share: at least half of all the FLOP (2 ranks), at most all of it.
        assert flops / 2 <= phase.seconds <= flops
    update = cost.phases["update_actor"]
    # Forward and backward (2x), no recomputation on the CPU platform (no gradient checkpointing).
    assert (update.tokens, update.flops) == (tokens, 3 * flops)
    assert "2 updates" in update.notes[0]
    gen = cost.phases["gen"]
    assert gen.tokens == 4 * (sum(prompts) + 3 * 16 + 8)
    assert gen.decode_steps == 3 * 16 + 8  # a trajectory's turns one after another, both of a replica's at once


def test_padding_costs_positions_and_pairs_and_bypass_drops_the_pass(tiny_model_dir):
    _, packed = tiny_step(tiny_model_dir, ["actor_rollout_ref.model.use_remove_padding=true"])
    _, padded = tiny_step(tiny_model_dir, [])  # the CPU platform: sdpa on padded rows
    for name in ("old_log_prob", "ref", "update_actor"):
        assert padded.phases[name].tokens == packed.phases[name].tokens
        assert padded.phases[name].computed_tokens > packed.phases[name].computed_tokens
        assert padded.phases[name].flops > packed.phases[name].flops
    # One row per micro-batch: nothing to pad, the same FLOP as packed rows.
    _, single = tiny_step(
        tiny_model_dir,
        [
            "actor_rollout_ref.actor.use_dynamic_bsz=false",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
            "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=false",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1",
            "actor_rollout_ref.ref.log_prob_use_dynamic_bsz=false",
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=1",
        ],
    )
    assert single.phases["old_log_prob"].flops == packed.phases["old_log_prob"].flops
    assert single.phases["old_log_prob"].padding == 0
    _, bypass = tiny_step(tiny_model_dir, ["algorithm.rollout_correction.bypass_mode=true"])
    assert bypass.phases["old_log_prob"].flops == 0 and bypass.phases["old_log_prob"].seconds == 0
    assert bypass.phases["ref"].flops == padded.phases["ref"].flops


def test_generated_lengths_given_replace_the_caps(tiny_model_dir):
    inputs, _ = tiny_step(tiny_model_dir, [], call_tokens=10, answer_tokens=4)
    assert dict(inputs.shapes.sources)["generated"] == "memory 10, answer 4 tokens a turn (given)"
    assert [[c.response for c in calls] for calls in inputs.trajectories()] == [[10, 10, 10, 4]] * 2
    with pytest.raises(ValueError, match="--call-tokens 17: between 1 and the cap, max_memorization_length=16"):
        tiny_step(tiny_model_dir, [], call_tokens=17)


def test_documents_are_read_through_the_memory_agent(tiny_model_dir, tiny_tokenizer, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from experiments.tiny.data import make_memory_rows

    rows = make_memory_rows(8, "train", seed=0)
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    inputs, cost = tiny_step(tiny_model_dir, [], data=path, step=2)
    # Step 2 of 2 prompts: rows 3 and 4 of the file; contexts centre-truncated to 4 chunks of 64 tokens.
    assert dict(inputs.shapes.sources)["documents"] == f"{path}, rows 3-4"
    expected = [min(len(tiny_tokenizer.encode(r["context"], add_special_tokens=False)), 256) for r in rows[2:4]]
    questions = [len(tiny_tokenizer.encode(r["prompt"][0]["content"], add_special_tokens=False)) for r in rows[2:4]]
    no_memory = len(tiny_tokenizer.encode("No previous memory", add_special_tokens=False))
    for calls, context, question in zip(inputs.trajectories(), expected, questions, strict=True):
        # Each memory call's prompt: template 211, the question, its chunk, the memory (16 after the first call).
        memories = [no_memory] + [16] * (len(calls) - 2)
        chunks = [c.prompt - 211 - question - m for c, m in zip(calls[:-1], memories, strict=True)]
        assert sum(chunks) == context and len(calls) == -(-context // 64) + 1
        assert calls[-1] == CallShape(111 + question + 16, 8)
    assert cost.rows == 2 * sum(-(-n // 64) + 1 for n in expected)
    with pytest.raises(ValueError, match=r"train.parquet: 8 rows, the step needs rows 9 to 10"):
        tiny_step(tiny_model_dir, [], data=path, step=5)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--config-name", "replicate_cpu"], "actor_rollout_ref.model.path=~/models/deepseek-llm-7b-chat: no local"),
        (["--call-tokens", "2000"], "--call-tokens 2000: between 1 and the cap, max_memorization_length=1024"),
        (["--answer-tokens", "0"], "--answer-tokens 0: between 1 and the cap, max_final_response_length=1024"),
        (["--config-name", "calculator_cpu"], "agent 'calculator' has no step cost model (step_shapes); --no-cost"),
    ],
)
def test_bad_cost_inputs_exit_2_with_the_reason(capsys, argv, message):
    from verl_ext.plan import main

    argv = argv if argv[0] == "--config-name" else ["--config-name", "memagent_7b", *argv]
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--data", "no/such.parquet"], "--data no/such.parquet: no such file"),
        (["--utilisation", "decode=0.3"], "--utilisation decode=0.3: phase must be one of gen, old_log_prob"),
        (["--utilisation", "1.5"], "--utilisation 1.5: a share of peak must be in (0, 1]"),
        (["--step", "0"], "--step 0: steps count from 1"),
        (["--devices", "0"], "--devices 0: at least 1"),
        (["--reported", "gen=100"], "--reported gen=100: PHASE=SECONDS, phase one of old_log_prob, ref, update_actor"),
        (["--reported", "step=-1"], "--reported step=-1: seconds must be positive"),
    ],
)
def test_bad_cost_options_exit_2_before_the_config_is_composed(capsys, argv, message):
    """A config that does not exist would stop the composition: the option's own reason comes first."""
    from verl_ext.plan import main

    with pytest.raises(SystemExit) as stop:
        main(["--config-name", "no_such_config", *argv])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert "no_such_config" not in err
    with pytest.raises(SystemExit) as stop:  # the same option with a config that composes: the same reason
        main(["--config-name", "memagent_7b", *argv])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


@pytest.mark.slow(seconds=40)
def test_the_plan_prints_the_cost_of_the_7b_14b_smoke_and_cpu_configs(capsys, tiny_model_dir):
    from verl_ext.plan import main

    def cost_lines(argv):
        main(argv)
        out = capsys.readouterr().out.splitlines()
        return out[out.index("cost of one step (docs/cluster.md, 'What a step costs'):") :]

    lines = cost_lines(["--config-name", "memagent_7b"])
    text = "\n".join(lines)
    assert "cluster: 32 x H100 SXM" in text and "Qwen2.5-7B-Instruct, 7.62B parameters" in text
    assert "every document 28,000 tokens (the paper's)" in text and "memory 1024, answer 1024 tokens" in text
    # A trajectory: 6185 + 4 x 7206 + 5206 + 2161 = 42,376 tokens (templates 134/89, question 24, chunks 5 x 5000
    # and 3000, memory and answer 1024); 2048 of them: 86,786,048 tokens through every pass.
    for phase in PHASES:
        assert any(line.split()[:2] == [phase, "86.79M"] for line in lines), phase
    assert "14336 (2048 trajectories)" in text
    text = "\n".join(cost_lines(["--config-name", "memagent_14b"]))
    assert "cluster: 128 x H100 SXM" in text and "64 replicas of 2 device(s)" in text and "28672 (4096" in text
    text = "\n".join(cost_lines(["--config-name", "smoke_gpu", "--device", "h200"]))
    assert "cluster: 8 x H200 SXM" in text and "Qwen2.5-0.5B-Instruct" in text
    text = "\n".join(cost_lines(["--config-name", "tiny_cpu", f"actor_rollout_ref.model.path={tiny_model_dir}"]))
    assert "cluster: 2 x CPU rank (calibrated, fp32)" in text and "of the calibrated rate" in text


def test_a_shape_needs_a_local_folder_or_a_published_one():
    with pytest.raises(ValueError, match="no local config.json and no published shape"):
        cost_report.model_shape(compose("memagent_7b", ["actor_rollout_ref.model.path=Org/Unknown-7B"]), None)
    assert cost_report.model_shape(compose("memagent_7b", []), None)[0] == ModelShape(
        "Qwen2.5-7B-Instruct", 3584, 28, 28, 4, 128, 18944, 152064, False
    )


def test_the_reported_time_and_the_utilisation_that_reconciles_it(capsys, tiny_model_dir):
    """Setting the utilisation the plan says reconciles a reported update time makes the modelled update that long
    (a FLOP-bound pass: time inversely proportional to utilisation)."""
    from verl_ext.plan import main

    base = ["--config-name", "tiny_cpu", f"actor_rollout_ref.model.path={tiny_model_dir}", "--device", "h100"]
    main([*base, "--reported", "update_actor=0.002", "--reported", "step=1"])
    out = capsys.readouterr().out.splitlines()
    line = next(x for x in out if x.startswith("reported update_actor: 0.002 s against"))
    reconciling = line.split("utilisation ")[1].split()[0]
    assert any(x.startswith("       reported step: 1 s, ") for x in out)
    main([*base, "--utilisation", f"update_actor={reconciling}"])
    update = next(x for x in capsys.readouterr().out.splitlines() if x.split()[:1] == ["update_actor"])
    assert float(update.split()[6]) * 1e3 == pytest.approx(2.0, rel=0.01)  # seconds, to 3 digits of utilisation


def test_verls_own_row_counting_makes_its_own_updates(tiny_model_dir):
    # recurrent.minibatch=rows: ppo_mini_batch_size x n = 1 x 2 rows an update; 16 rows make 8 updates, every row once.
    _, rows = tiny_step(tiny_model_dir, ["recurrent.minibatch=rows", "actor_rollout_ref.model.use_remove_padding=true"])
    _, trajectory = tiny_step(tiny_model_dir, ["actor_rollout_ref.model.use_remove_padding=true"])
    assert "8 updates" in rows.phases["update_actor"].notes[0]
    assert rows.phases["update_actor"].flops == trajectory.phases["update_actor"].flops


TOY_AGENT = """
from dataclasses import dataclass

from recurrent.interface import WorkflowConfig, WorkflowRegistration
from recurrent.step_shapes import CallShape, StepShapes


@dataclass
class ToyConfig(WorkflowConfig):
    pass


def build(config, tokenizer):
    raise AssertionError("the cost model builds no agent")


def step_shapes(config, tokenizer, request):
    call = request.call_tokens or 10
    calls = [CallShape(100, call), CallShape(50, request.answer_tokens or 5)]
    seen = f"prompts {request.prompts}, first {request.first}, data {request.data}, tokenizer {tokenizer is not None}"
    return StepShapes([calls] * request.prompts, [("toy calls", "two a trajectory"), ("toy request", seen)])


REGISTER = WorkflowRegistration("toy", ToyConfig, build, step_shapes=step_shapes)
"""


def test_an_agent_is_costed_through_its_registration_alone(tiny_model_dir, tmp_path):
    """A test's own agent, two calls a trajectory: the tokens and FLOP of every pass by hand from its calls, its
    request as the plan made it, its sources in the report."""
    agent = tmp_path / "toy_agent.py"
    agent.write_text(TOY_AGENT)
    inputs, cost = tiny_step(tiny_model_dir, ["actor_rollout_ref.model.use_remove_padding=true"], str(agent), step=3)
    assert dict(inputs.shapes.sources) == {
        "toy calls": "two a trajectory",
        "toy request": "prompts 2, first 4, data None, tokenizer True",  # step 3 of 2 prompts: rows 5 and 6
    }
    # 2 prompts x 2 trajectories x rows of 110 and 55 tokens; the tiny model's 671,744 FLOP a token and 512 a pair.
    assert (cost.rows, cost.trajectories) == (8, 4)
    flops = 4 * sum(671_744 * n + 512 * n * (n + 1) // 2 for n in (110, 55))
    old = cost.phases["old_log_prob"]
    assert (old.tokens, old.flops) == (4 * 165, flops)
    assert cost.phases["update_actor"].flops == 3 * flops
    assert cost.phases["gen"].decode_steps == 10 + 5
    lines = cost_report.report(compose("tiny_cpu", [f"actor_rollout_ref.model.path={tiny_model_dir}"]), inputs, cost)
    assert "           toy calls: two a trajectory" in lines


def test_an_agent_without_a_cost_model_is_named():
    with pytest.raises(ValueError, match="agent 'calculator' has no step cost model"):
        cost_report.agent_cost_model(compose("calculator_cpu", []))
