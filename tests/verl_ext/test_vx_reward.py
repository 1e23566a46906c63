"""The reward through verl's own V1 plumbing: verl's reward worker and manager score the final answer with our
strict verifier, the score lands at the final answer's last token, and verl copies it to every memory turn
(``verl/trainer/ppo/v1/agent_loop_tq.py:150-227``). Rows are captured where verl writes them to TransferQueue."""

from __future__ import annotations

import pytest
from verl.experimental.agent_loop.agent_loop import DictConfigWrap
from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ
from verl.utils.dataset.rl_dataset import RLHFDataset
from verl.utils.import_utils import load_extern_object
from verl.workers.rollout.replica import TokenOutput
from vx_helpers import TINY_BUDGETS, capture_transfer_queue, compose_config, make_worker

from taskutils.verifiers import strict
from verl_ext.agent_loop import RecurrentAgentLoop

FINAL_CAP = 24
MEMORY_ANSWER = "so far \\boxed{42}"  # a memory that already holds a correct box: it must not be scored


class ScriptedServer:
    """Token server with scripted replies: memory turns say MEMORY_ANSWER, the final turn says ``answer``."""

    def __init__(self, tokenizer, answer: str):
        self.tokenizer, self.answer = tokenizer, answer

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        cap = sampling_params["max_tokens"]
        text = self.answer if cap == FINAL_CAP else MEMORY_ANSWER
        ids = self.tokenizer.encode(text, add_special_tokens=False)[: cap - 1] + [self.tokenizer.eos_token_id]
        return TokenOutput(
            token_ids=ids, log_probs=[-0.5] * len(ids), stop_reason="completed", extra_fields={"global_steps": 3}
        )


# tiny_cpu trains with a dense test reward (experiments.tiny.reward) and answers of 8 tokens; these tests are
# about the real reward, with answers of up to FINAL_CAP tokens.
STRICT_REWARD = [
    "reward.custom_reward_function.path=pkg://taskutils.verifiers.strict",
    "reward.custom_reward_function.name=compute_score",
    f"data.max_response_length={FINAL_CAP}",
]


@pytest.fixture(scope="module")
def config(tiny_model_dir):
    return compose_config(
        "tiny_cpu",
        [
            *TINY_BUDGETS,
            *STRICT_REWARD,
            f"recurrent.config.max_final_response_length={FINAL_CAP}",
            f"actor_rollout_ref.model.path={tiny_model_dir}",
        ],
    )


@pytest.fixture
def stored(monkeypatch):
    return capture_transfer_queue(monkeypatch)["rows"]


def row(uid: str, context: str, ground_truth: str) -> dict:
    chat = [{"role": "user", "content": "What is the magic number?"}]
    return {
        "uid": uid,
        "session_id": 0,
        "global_steps": 3,
        "index": 0,
        "prompt": chat,
        "raw_prompt": chat,
        "context": context,
        "data_source": "hotpotqa",
        "reward_model": {"ground_truth": ground_truth},
        "extra_info": {},
    }


def test_reward_function_is_the_strict_verifier_loaded_by_verl():
    fn = load_extern_object(module_path="pkg://taskutils.verifiers.strict", object_name="compute_score")
    assert fn.__module__ == "taskutils.verifiers.strict" and fn is strict.compute_score
    assert fn("hotpotqa", "... so the answer is \\boxed{The Beatles}", ["the beatles"]) == 1.0  # case, spaces
    assert fn("hotpotqa", "\\boxed{Beatles}", ["The Beatles"]) == 0.0  # articles count
    assert fn("hotpotqa", "\\boxed{1} then \\boxed{2}", ["2"]) == 1.0  # the last box
    assert fn("hotpotqa", "\\boxed{x}" + " pad" * 100, ["x"]) == 0.0  # only the last 300 characters


async def trajectory(config, tokenizer, answer: str) -> tuple[dict, list]:
    """A sample with a document of several chunks and its rows, the final answer being ``answer``."""
    context = "The river city was born in the year of the film. " * 4 + "The magic number is 42."
    loop = RecurrentAgentLoop(
        trainer_config=DictConfigWrap(config),
        server_manager=ScriptedServer(tokenizer, answer),
        tokenizer=tokenizer,
        processor=None,
        dataset_cls=RLHFDataset,
        data_config=DictConfigWrap(config.data),
    )
    sample = row("uidA", context, "42")
    return sample, await loop.run({"temperature": 1.0, "logprobs": True}, **sample)


@pytest.mark.parametrize(("answer", "score"), [("It is \\boxed{42}", 1.0), ("It is \\boxed{41}", 0.0)])
async def test_reward_lands_at_the_final_answers_last_token_and_reaches_every_turn(
    config, tiny_tokenizer, stored, answer, score
):
    sample, outputs = await trajectory(config, tiny_tokenizer, answer)
    chunks = len(outputs) - 1
    assert chunks >= 3 and all(o.extra_fields["finish_reason"] == "stop" for o in outputs)

    await make_worker(config, tiny_tokenizer)._agent_loop_postprocess(outputs, False, **sample)

    (put,) = stored
    fields = put["fields"]
    assert put["keys"] == [f"uidA_0_{i}" for i in range(chunks + 1)] and put["partition_id"] == "train"
    for i, output in enumerate(outputs):
        rm_scores = fields["rm_scores"][i]
        assert len(rm_scores) == len(output.response_ids) == len(fields["responses"][i])
        expected = [0.0] * (len(output.response_ids) - 1) + [score]  # at the last valid token of each row
        assert rm_scores.tolist() == expected
        assert fields["loss_mask"][i].tolist() == [1] * len(output.response_ids)
    info = fields["extra_fields"][chunks]["reward_extra_info"]
    assert info["acc"] == score  # verl records the verifier's verdict as acc
    memory_tokens = min(len(tiny_tokenizer.encode(MEMORY_ANSWER, add_special_tokens=False)), 8 - 1) + 1  # + eos
    assert info["calls"] == chunks and info["call_tokens"] == memory_tokens and info["call_truncated"] == 0
    assert "context" not in list(fields.keys())  # the long document is not copied into every row
    assert [t["min_global_steps"] for t in put["tags"]] == [3] * (chunks + 1)


async def test_stock_verl_would_cut_the_final_answer_short(config, tiny_tokenizer):
    """Why our worker sends only the final answer to the reward worker: verl 0.9.1's own multi-output scoring
    pads all rows together and reads the last row's length from the wrong columns (see
    RecurrentAgentLoopWorkerImpl._compute_score). If this starts failing, verl fixed it and the override can go."""
    sample, outputs = await trajectory(config, tiny_tokenizer, "It is \\boxed{42}")
    sample.pop("context")
    stock = AgentLoopWorkerTQ.__ray_actor_class__._compute_score
    await stock(make_worker(config, tiny_tokenizer), outputs, sample)
    assert outputs[-1].reward_score == 0.0  # a correct answer, decoded from padding


async def test_overlong_shaping_switch_penalises_the_final_answer_only(tiny_model_dir, tiny_tokenizer, stored):
    # verl's dapo manager: expected length max_resp_len - len = 24 - 16 = 8 tokens; the answer has 8 + eos = 9,
    # one over: penalty -1/16 x factor 1. The verdict (acc) is unchanged; the reward carries the shaping.
    overlong = ["enable=true", "len=16", "penalty_factor=1.0", "log=true"]
    config = compose_config(
        "tiny_cpu",
        [
            *TINY_BUDGETS,
            *STRICT_REWARD,
            f"recurrent.config.max_final_response_length={FINAL_CAP}",
            f"actor_rollout_ref.model.path={tiny_model_dir}",
            *[f"reward.reward_kwargs.overlong_buffer_cfg.{kv}" for kv in overlong],
        ],
    )
    answer = "It is \\boxed{42}"
    assert len(tiny_tokenizer.encode(answer, add_special_tokens=False)) + 1 == 9
    sample, outputs = await trajectory(config, tiny_tokenizer, answer)
    await make_worker(config, tiny_tokenizer)._agent_loop_postprocess(outputs, False, **sample)
    fields = stored[0]["fields"]
    info = fields["extra_fields"][len(outputs) - 1]["reward_extra_info"]
    assert info["acc"] == 1.0 and info["overlong_reward"] == -1 / 16
    assert [float(fields["rm_scores"][i].sum()) for i in range(len(outputs))] == [1 - 1 / 16] * len(outputs)
