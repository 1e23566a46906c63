"""One MemAgent RL step, in the order it runs, on CPU in seconds, without Ray.

    .venv/bin/python examples/one_step.py [--n 4] [--seed 0]

What a training step does to one prompt, with the project's own pieces and verl's own algorithm functions:

1. the run config (``configs/tiny_cpu.yaml``: the paper's algorithm at tiny sizes) and the tiny offline model;
2. one question about a document of several chunks, rolled out ``n`` times by the memory agent
   (``recurrent/impls/memory.py``) in lockstep rounds (``recurrent/generation_manager.py``, fed to verl's token
   server by ``verl_ext/sync_rollout.py``): each chunk is a fresh conversation whose reply overwrites the memory,
   then the final answer;
3. the reward of each trajectory's final answer (the run's reward function; the strict verdict beside it);
4. GRPO over the ``n`` trajectories without std division: one advantage per trajectory, on every turn
   (verl's ``compute_advantage_for_multi_trajectories``);
5. verl's policy loss (PPO-clip + KL to the reference, token-mean over every turn's tokens) and one AdamW
   update; the log-probability of each trajectory's tokens before and after.
"""

from __future__ import annotations

import argparse
import asyncio

import numpy as np
import torch
from tensordict import TensorDict
from transformers import AutoModelForCausalLM, AutoTokenizer
from verl import DataProto
from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories
from verl.utils import tensordict_utils as tu
from verl.utils.config import omega_conf_to_dataclass
from verl.utils.import_utils import load_extern_object
from verl.workers.utils.losses import ppo_loss

from recurrent.models import TINY, materialize
from taskutils.verifiers.strict import compute_score as strict_score
from verl_ext.cpu.hf_server import HFTokenServer
from verl_ext.plan import compose
from verl_ext.rollout import AgentRollout
from verl_ext.sync_rollout import Trajectory, run_trajectories

QUESTION = "What is the magic number?"
CONTEXT = "The river city was born in the year of the film. " * 6 + "The magic number is 42. " + "It rained. " * 20
ANSWER = "42"
BUDGETS = [
    "recurrent.config.chunk_size=32",
    "recurrent.config.max_memorization_length=12",
    "recurrent.config.max_final_response_length=8",
]


def token_log_probs(model: torch.nn.Module, rows: list[tuple[list[int], list[int]]]) -> list[torch.Tensor]:
    """Per row (prompt ids, response ids): log p(token t+1 | tokens <= t) at every position t, the last one 0
    (the unpadded layout verl's loss reads)."""
    out = []
    for prompt, response in rows:
        ids = torch.tensor([prompt + response])
        logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), dim=-1)
        picked = logp.gather(-1, ids[0, 1:].unsqueeze(-1)).squeeze(-1)
        out.append(torch.cat([picked, picked.new_zeros(1)]))
    return out


def response_log_probs(model: torch.nn.Module, rows: list[tuple[list[int], list[int]]]) -> list[torch.Tensor]:
    """The log-probabilities of each row's response tokens only."""
    with torch.no_grad():
        full = token_log_probs(model, rows)
    return [seq[len(p) - 1 : len(p) - 1 + len(r)] for seq, (p, r) in zip(full, rows, strict=True)]


def nested(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.nested.as_nested_tensor(tensors, layout=torch.jagged)


def grpo_advantages(keys: list[str], rows, rewards: dict[str, float], n: int) -> list[torch.Tensor]:
    """verl's multi-trajectory GRPO: each trajectory's reward at its answer's last token, the group mean
    subtracted (no std division), the result on every token of every turn of the trajectory."""
    width = max(len(r) for _, r in rows)
    mask, scores = torch.zeros(len(rows), width, dtype=torch.long), torch.zeros(len(rows), width)
    for i, (key, (_, response)) in enumerate(zip(keys, rows, strict=True)):
        mask[i, : len(response)] = 1
        scores[i, len(response) - 1] = rewards[key.rsplit("_", 1)[0]]
    data = DataProto.from_dict(
        tensors={"response_mask": mask, "token_level_rewards": scores},
        non_tensors={"uid": np.array([key.split("_")[0] for key in keys], dtype=object)},
    )
    data = compute_advantage_for_multi_trajectories(data, keys, "grpo", num_repeat=n, norm_adv_by_std_in_grpo=False)
    return [data.batch["advantages"][i, : len(r)] for i, (_, r) in enumerate(rows)]


def policy_loss(actor_config, model, rows, old, advantages) -> torch.Tensor:
    """verl's loss on the rows (``verl.workers.utils.losses.ppo_loss``, what its FSDP workers call)."""
    data = TensorDict(
        {
            "prompts": nested([torch.tensor(p) for p, _ in rows]),
            "responses": nested([torch.tensor(r) for _, r in rows]),
            "response_mask": nested([torch.ones(len(r), dtype=torch.long) for _, r in rows]),
            "old_log_probs": nested(old),
            "ref_log_prob": nested(old),  # the reference policy is the model before the step
            "advantages": nested(advantages),
        },
        batch_size=[len(rows)],
    )
    tokens = sum(len(r) for _, r in rows)
    for key, value in {"dp_size": 1, "batch_num_tokens": tokens, "global_batch_size": len(rows)}.items():
        tu.assign_non_tensor_data(data, key, value)
    loss, _ = ppo_loss(actor_config, {"log_probs": torch.cat(token_log_probs(model, rows))}, data)
    return loss


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=4, help="trajectories of the prompt (GRPO group size)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)

    # 1. The run config and the model.
    model_dir = str(materialize(TINY))
    config = compose("tiny_cpu", [*BUDGETS, f"actor_rollout_ref.model.path={model_dir}"])
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    server = HFTokenServer(model, tokenizer)  # the rollout server, in this process, sharing the model
    print(f"[1] config tiny_cpu, model {model_dir} ({sum(p.numel() for p in model.parameters()):,} parameters)")

    # 2. Roll the prompt out n times: memory turns chunk by chunk, then the answer.
    rollout = AgentRollout.get(config, tokenizer)
    sample = {"uid": "prompt0", "prompt": QUESTION, "context": CONTEXT}
    params = {"temperature": 1.0, "logprobs": True}
    trajectories = [Trajectory(sample, s, {**params, "seed": args.seed + s}) for s in range(args.n)]
    outputs = asyncio.run(run_trajectories(rollout, server, trajectories))
    keys, rows = [], []
    for session, turns in enumerate(outputs):
        if isinstance(turns, Exception):
            raise turns
        for index, turn in enumerate(turns):
            keys.append(f"prompt0_{session}_{index}")
            rows.append((list(turn.prompt_ids), list(turn.response_ids)))
        memory = tokenizer.decode(turns[-2].response_ids, skip_special_tokens=True) if len(turns) > 1 else ""
        answer = tokenizer.decode(turns[-1].response_ids, skip_special_tokens=True)
        print(f"[2] trajectory {session}: {len(turns) - 1} memory turns, last memory {memory!r}, answer {answer!r}")

    # 3. One reward per trajectory, on its final answer.
    reward_fn = load_extern_object(config.reward.custom_reward_function.path, config.reward.custom_reward_function.name)
    rewards, finals = {}, {}
    for key, (_, response) in zip(keys, rows, strict=True):
        finals[key.rsplit("_", 1)[0]] = tokenizer.decode(response, skip_special_tokens=True)  # the last row wins
    for trajectory, answer in finals.items():
        score = reward_fn("toy_memory", answer, ANSWER)  # a float, or a dict with "score" (verl accepts both)
        rewards[trajectory] = float(score["score"] if isinstance(score, dict) else score)
        print(f"[3] {trajectory}: reward {rewards[trajectory]:.3f}, strict {strict_score('toy', answer, ANSWER)}")

    # 4. GRPO: the same advantage on every turn of a trajectory.
    advantages = grpo_advantages(keys, rows, rewards, args.n)
    for key, advantage in zip(keys, advantages, strict=True):
        print(f"[4] row {key}: {len(advantage)} tokens, advantage {float(advantage[0]):+.4f}")

    # 5. verl's loss and one AdamW update (the run's optimizer settings).
    actor = omega_conf_to_dataclass(config.actor_rollout_ref.actor)
    old = response_log_probs(model, rows)
    model.train()
    loss = policy_loss(actor, model, rows, old, advantages)
    loss.backward()
    optim = torch.optim.AdamW(model.parameters(), lr=actor.optim.lr, weight_decay=actor.optim.weight_decay)
    optim.step()
    new = response_log_probs(model, rows)
    change = {}
    for key, before, after in zip(keys, old, new, strict=True):
        trajectory = key.rsplit("_", 1)[0]
        change[trajectory] = change.get(trajectory, 0.0) + float((after - before).sum())
    print(f"[5] loss {float(loss):.5f}; log-prob change per trajectory (all turns):")
    for trajectory, delta in change.items():
        adv = float(advantages[keys.index(trajectory + "_0")][0])
        print(f"    {trajectory}: advantage {adv:+.4f} -> {delta:+.4f}")
    return {"keys": keys, "rewards": rewards, "advantages": advantages, "change": change, "loss": float(loss)}


if __name__ == "__main__":
    main()
