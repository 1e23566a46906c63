"""The calculator agent's accuracy with a local model: the real agent function, greedy (or sampled), in process.

    python -m experiments.calculator.evaluate MODEL_DIR [MODEL_DIR ...] [--split test] [--problems 128] [--sample]

Each problem is one episode of the registered agent (``experiments.calculator.agent``, the settings of
configs/calculator_cpu.yaml) whose calls go through the training rollout's client
(:class:`verl_ext.rollout.TokenClient`: the chat template renders them, as in training) to
:class:`verl_ext.cpu.hf_server.HFTokenServer` (the CPU rollout server's generation: concurrent calls batched,
left-padded).
The answer is scored by the training reward (``taskutils.verifiers.strict.compute_score``: the strict verifier).
Reported per model: accuracy, and per operator the accuracy and how often the first call was a tool call.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from experiments.calculator.agent import CalculatorConfig, parse_tool_call
from experiments.calculator.task import OPERATORS, problems
from experiments.calculator.teacher import RUN_CONFIG, agent_config
from taskutils.verifiers.strict import strict_score

if TYPE_CHECKING:  # verl loads in seconds: the command imports it when it evaluates
    from verl_ext.rollout import Budgets


def evaluate(
    model_dir: str | Path,
    split: str = "test",
    count: int = 128,
    sample: bool = False,
    seed: int = 0,
    config: CalculatorConfig | None = None,
) -> dict[str, Any]:
    """Run the agent on ``count`` problems of ``split`` with the model in ``model_dir``; a summary with examples."""
    import torch
    from transformers import AutoTokenizer

    from verl_ext.cpu.hf_server import HFTokenServer
    from verl_ext.rollout import AgentRollout, TokenClient
    from verl_ext.settings import RecurrentSettings

    config = config or agent_config()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    torch.manual_seed(seed)
    server = HFTokenServer(str(model_dir), tokenizer=tokenizer)
    # The training rollout's agent and client (prompts rendered, calls checked against the rows, as in training).
    settings = RecurrentSettings(agent="calculator", agent_config=asdict(config))
    rollout = AgentRollout(settings, tokenizer, run_budgets())
    sampling = {"temperature": 1.0 if sample else 0.0, "top_p": 1.0, "top_k": -1}
    chosen = problems(split, count, seed)
    episodes = [rollout.agent.episode({config.question_key: p.question}) for p in chosen]

    async def run_all() -> None:
        clients = [TokenClient(rollout, server, f"eval-{i}", sampling) for i in range(len(episodes))]
        await asyncio.gather(*(episode.run(client) for episode, client in zip(episodes, clients, strict=True)))

    start = time.perf_counter()
    asyncio.run(run_all())
    seconds = time.perf_counter() - start
    records = []
    for problem, episode in zip(chosen, episodes, strict=True):
        calls = [record.reply.text for record in episode.history]
        records.append(
            {
                "question": problem.question,
                "answer": problem.answer,
                "op": problem.op,
                "calls": calls,
                "tool_first": parse_tool_call(calls[0]) is not None,
                "correct": strict_score(episode.answer or "", [str(problem.answer)]) == 1.0,
            }
        )
    return summary(records) | {
        "model": str(model_dir),
        "split": split,
        "sample": sample,
        "seconds": round(seconds, 1),
        "examples": records[:3],
    }


def run_budgets(path: Path = RUN_CONFIG) -> Budgets:
    """verl's row widths of the RL run (``data.max_prompt_length`` and ``max_response_length`` of
    configs/calculator_cpu.yaml): the calls evaluated are refused where training would refuse them."""
    from omegaconf import OmegaConf

    from recurrent.options import check_yaml
    from verl_ext.rollout import Budgets

    check_yaml(path)  # one line for a file OmegaConf could not read in bounded time
    data = OmegaConf.load(path).data
    return Budgets(int(data.max_prompt_length), int(data.max_response_length))


def summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Accuracy overall and per operator, the share of first calls that call the tool, calls per problem."""

    def share(items: list[dict], key: str) -> float:
        return round(sum(item[key] for item in items) / len(items), 3) if items else 0.0

    per_op = {}
    for op in OPERATORS:
        items = [r for r in records if r["op"] == op]
        per_op[op] = {
            "problems": len(items),
            "accuracy": share(items, "correct"),
            "tool_first": share(items, "tool_first"),
        }
    return {
        "problems": len(records),
        "accuracy": share(records, "correct"),
        "tool_first": share(records, "tool_first"),
        "calls_per_problem": round(sum(len(r["calls"]) for r in records) / len(records), 3),
        "by_operator": per_op,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.calculator.evaluate", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("models", nargs="+", type=Path, help="model folders (Hugging Face, with the tokenizer)")
    parser.add_argument("--split", default="test", choices=("train", "validation", "test"))
    parser.add_argument("--problems", type=int, default=128)
    parser.add_argument("--sample", action="store_true", help="sample at temperature 1 instead of greedy")
    parser.add_argument("--seed", type=int, default=0, help="which problems (and the sampling seed)")
    parser.add_argument("--out", type=Path, help="also write the results as JSON lines here")
    args = parser.parse_args(argv)
    for folder in args.models:
        if not (folder / "config.json").is_file():
            parser.error(f"{folder} holds no model (no config.json)")
    if args.problems < 1:
        parser.error(f"--problems must be at least 1, got {args.problems}")
    results = []
    for folder in args.models:
        result = evaluate(folder, args.split, args.problems, args.sample, args.seed)
        results.append(result)
        print(json.dumps({k: v for k, v in result.items() if k != "examples"}), flush=True)
    if args.out:
        args.out.write_text("".join(json.dumps(r) + "\n" for r in results))


if __name__ == "__main__":
    main()
