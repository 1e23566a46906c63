"""Benchmark: the recording route (an ``openai.AsyncOpenAI`` served in process, recurrent/openai_route.py) against the
framework's own chat client, side by side in one run: the calculator (experiments/calculator/agent.py) and the
same agent on the ``openai`` client (experiments/calculator/openai_agent.py), through training's rollout code
(verl_ext/rollout.py: episodes, the token client, one row per call) with
configs/calculator_cpu.yaml's settings.

- ``scripted``: a token server that answers at once (a calculator call, then the boxed result): the framework's
  own cost per call, where the route's overhead is all there is to see;
- ``tiny``: the CPU rollout server (verl_ext/cpu/hf_server.py) with the tiny offline model, one step's batch
of
  trajectories at once (train_batch_size x rollout.n), greedy so both agents get the same replies: the rollout
  part of a CPU training step. Its rollout is part of a step, so the share added here bounds the step's from above.

The agents alternate and each keeps its fastest repeat (other load only slows a run down). One torch thread. Last,
the scripted per-call overhead times the calls of a step of the recorded CPU calculator run
(docs/calculator_cpu/metrics.jsonl), as a share of that step's time.

    OMP_NUM_THREADS=1 .venv/bin/python scripts/bench_openai_route.py [--trajectories 200] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

AGENTS = ("calculator", "calculator_openai")
# The tiny tokenizer spends 68 tokens on the call: rows wide enough for it (as tests/verl_ext/test_vx_openai_rows.py).
WIDE = ("recurrent.config.max_tokens_per_turn=96", "data.max_response_length=96", "data.max_prompt_length=640")
CALL = '<tool_call>{"name": "calculate", "arguments": {"expression": "37 * 48"}}</tool_call>'


class ScriptedServer:
    """Answers at once: a prompt without a tool result gets a call, one with a result gets it boxed."""

    def __init__(self, tokenizer) -> None:
        self.eos = tokenizer.eos_token_id
        self.call = tokenizer.encode(CALL, add_special_tokens=False) + [self.eos]
        self.answer = tokenizer.encode("So \\boxed{1776}", add_special_tokens=False) + [self.eos]
        self.marker = tokenizer.encode("<tool_response>", add_special_tokens=False)[0]

    async def generate(self, request_id, *, prompt_ids, sampling_params, **_):
        from verl.workers.rollout.replica import TokenOutput

        ids = self.answer if self.marker in prompt_ids[-40:] else self.call
        return TokenOutput(token_ids=ids, log_probs=[-0.5] * len(ids), stop_reason="completed", extra_fields={})


def rollout_of(agent: str, model_dir: str, tokenizer):
    from hydra import compose, initialize_config_dir

    import verl_ext  # noqa: F401  (the configs' resolvers)
    from verl_ext.rollout import AgentRollout

    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base=None):
        config = compose(
            "calculator_cpu", [f"actor_rollout_ref.model.path={model_dir}", f"recurrent.agent={agent}", *WIDE]
        )
    return AgentRollout.get(config, tokenizer)


async def one_trajectory(rollout, server, index: int, sampling: dict) -> int:
    from recurrent.async_manager import run_session
    from verl_ext.rollout import TokenClient

    question = [{"role": "user", "content": f"What is {10 + index % 80} * 48?"}]
    episode = await rollout.episode({"prompt": question})
    await run_session(episode, TokenClient(rollout, server, f"r{index}", sampling))
    return len(rollout.outputs(episode, want_logprobs=True))


async def timed(rollout, server, trajectories: int, concurrent: bool, sampling: dict) -> tuple[float, int]:
    start = time.perf_counter()
    if concurrent:
        rows = await asyncio.gather(*(one_trajectory(rollout, server, i, sampling) for i in range(trajectories)))
    else:
        rows = [await one_trajectory(rollout, server, i, sampling) for i in range(trajectories)]
    return time.perf_counter() - start, sum(rows)


def side_by_side(name: str, rollouts: dict, server, trajectories: int, repeats: int, concurrent: bool) -> float:
    sampling = {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "logprobs": True}
    best: dict[str, tuple[float, int]] = {}
    for _ in range(repeats):
        for agent in AGENTS:
            seconds, rows = asyncio.run(timed(rollouts[agent], server, trajectories, concurrent, sampling))
            if agent not in best or seconds < best[agent][0]:
                best[agent] = (seconds, rows)
    (text_s, text_rows), (route_s, route_rows) = best["calculator"], best["calculator_openai"]
    per_call = (route_s / route_rows - text_s / text_rows) * 1e6
    print(f"{name}: {trajectories} trajectories, best of {repeats}")
    for agent in AGENTS:
        seconds, rows = best[agent]
        print(f"  {agent:18s} {seconds:8.3f} s  {rows:5d} calls  {seconds / rows * 1e6:9.0f} us/call")
    print(f"  ratio openai/text {route_s / text_s:.3f}  (route adds {per_call:.0f} us a call)")
    return per_call


def recorded_step() -> tuple[float, float]:
    """The median seconds and model calls of a step of the recorded CPU calculator run (docs/calculator_cpu.md)."""
    lines = (REPO / "docs" / "calculator_cpu" / "metrics.jsonl").read_text().splitlines()
    steps = [json.loads(line)["data"] for line in lines]
    steps = [d for d in steps if "timing_s/step" in d]
    calls = [d["recurrent/num_trajectories"] * d["recurrent/turns_per_sample/mean"] for d in steps]
    return statistics.median(d["timing_s/step"] for d in steps), statistics.median(calls)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trajectories", type=int, default=200, help="scripted: trajectories, one at a time")
    parser.add_argument("--batch", type=int, default=32, help="tiny: trajectories at once (8 problems x n 4)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    import torch

    from recurrent.models import TINY, load_tokenizer, materialize
    from verl_ext.cpu.hf_server import HFTokenServer

    torch.set_num_threads(1)
    model_dir = str(materialize(TINY))
    tokenizer = load_tokenizer(model_dir)
    rollouts = {agent: rollout_of(agent, model_dir, tokenizer) for agent in AGENTS}
    per_call = side_by_side("scripted", rollouts, ScriptedServer(tokenizer), args.trajectories, args.repeats, False)
    side_by_side("tiny", rollouts, HFTokenServer(model_dir, tokenizer), args.batch, args.repeats, concurrent=True)
    step_s, calls = recorded_step()
    added = per_call * 1e-6 * calls
    print(
        f"a CPU calculator step (docs/calculator_cpu.md: median {step_s:.2f} s, {calls:.0f} calls): the route adds "
        f"{added * 1e3:.0f} ms = {added / step_s:.1%} (target <= 10%)"
    )


if __name__ == "__main__":
    main()
