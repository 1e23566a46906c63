"""The memory agent's definition: prompts, chunking, truncation, memory overwrite, bad input."""

import asyncio
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf
from transformers import AutoTokenizer

from recurrent.async_manager import run_session
from recurrent.impls import memory
from recurrent.impls.memory import MemoryConfig, MemoryWorkflow
from recurrent.interface import Reply, Turn, load_register

# The fork's two prompts, written out line by line (an independent route to the same bytes).
INSTRUCTION = (
    "You are presented with a problem, a section of an article that may contain the answer to the problem, "
    "and a previous memory. Please read the provided section carefully and update the memory with the new "
    "information that helps to answer the problem. Be sure to retain all relevant details from the previous "
    "memory while adding any new, useful information."
)
SPEC_MEMORY_LINES = [
    INSTRUCTION,
    "",
    "<problem> ",
    "{prompt}",
    "</problem>",
    "",
    "<memory>",
    "{memory}",
    "</memory>",
    "",
    "<section>",
    "{chunk}",
    "</section>",
    "",
    "Updated memory:",
    "",
]
# fmt: off
SPEC_FINAL_LINES = [
    "You are presented with a problem and a previous memory. Please answer the problem based on the previous "
    "memory and put the answer in \\boxed{}.",
    "", "<problem> ", "{prompt}", "</problem>", "", "<memory>", "{memory}", "</memory>", "", "Your answer:", "",
]
# fmt: on


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def reply(text: str, tokenizer=None, finish: str = "stop") -> Reply:
    ids = None if tokenizer is None else tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
    return Reply(text=text, finish_reason=finish, token_ids=ids, completion_tokens=len(ids or []))


class Script:
    """A model that answers the ``n``-th call (from 0) with ``answer(n, turn)``: the agent's calls seen whole."""

    def __init__(self, answer) -> None:
        self.answer, self.turns = answer, []

    async def send_turn(self, turn: Turn, **_) -> Reply:
        self.turns.append(turn)
        return self.answer(len(self.turns) - 1, turn)


def run(episode, answer=lambda n, turn: Reply("m", "stop")):
    """Run ``episode`` to its end against a :class:`Script` model; returns the episode."""
    asyncio.run(run_session(episode, Script(answer)))
    return episode


def first_turn(workflow, sample) -> Turn:
    return run(workflow.episode(sample)).history[0].turn


def test_prompts_match_the_spec_byte_for_byte():
    assert memory.MEMORY_TEMPLATE == "\n".join(SPEC_MEMORY_LINES)
    assert memory.FINAL_TEMPLATE_BOXED == "\n".join(SPEC_FINAL_LINES)
    assert memory.NO_MEMORY == "No previous memory"
    # The evaluation variant differs from the boxed prompt in the instruction line only.
    boxed, answer_is = memory.FINAL_TEMPLATE_BOXED.split("\n"), memory.FINAL_TEMPLATE_ANSWER_IS.split("\n")
    assert boxed[1:] == answer_is[1:]
    assert answer_is[0].endswith('format your response as follows "Therefore, the answer is (insert answer here)".')


# What the released checkpoints saw as the final instruction (their runs used the fork's sync path, which keeps
# the source's doubled braces; docs/fidelity.md): written out by hand, not derived from the boxed prompt.
RELEASED_FINAL_INSTRUCTION = (
    "You are presented with a problem and a previous memory. Please answer the problem based on the previous "
    "memory and put the answer in \\boxed{{}}."
)


# The tiny model's chat template around the user message (ChatML, default system prompt), written out by hand.
CHAT_HEAD = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
CHAT_TAIL = "<|im_end|>\n<|im_start|>assistant\n"


def final_prompt_by_hand(tokenizer, instruction: str, question_ids: list[int], memory_ids: list[int]) -> list[int]:
    """The final turn's token prompt from SPEC_FINAL_LINES: each literal piece encoded on its own, the question and
    memory ids put in between (the fork's token template)."""
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    return (
        encode(CHAT_HEAD + instruction + "\n\n<problem> \n")
        + list(question_ids)
        + encode("\n</problem>\n\n<memory>\n")
        + list(memory_ids)
        + encode("\n</memory>\n\nYour answer:\n" + CHAT_TAIL)
    )


def test_training_final_prompt_is_what_the_released_checkpoints_saw(tokenizer):
    assert memory.FINAL_TEMPLATE_BOXED_RELEASED == "\n".join([RELEASED_FINAL_INSTRUCTION, *SPEC_FINAL_LINES[1:]])
    workflow = MemoryWorkflow(MemoryConfig(chunk_size=8, final_prompt="boxed_released"), tokenizer)
    turn = first_turn(workflow, {"prompt": "Who won?", "context": ""})  # no chunk: the final call comes first
    assert turn.final
    # The fork's token template: the chat template around the message, cut at the slots; every literal piece
    # is tokenized on its own and the question and memory ids are put in between.
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": "SLOT"}], tokenize=False, add_generation_prompt=True
    )
    head, tail = chat.split("SLOT")
    pieces = [
        head + RELEASED_FINAL_INSTRUCTION + "\n\n<problem> \n",
        "\n</problem>\n\n<memory>\n",
        "\n</memory>\n\nYour answer:\n" + tail,
    ]
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    expected = encode(pieces[0]) + encode("Who won?") + encode(pieces[1]) + encode("No previous memory")
    expected += encode(pieces[2])
    assert list(turn.prompt_ids) == expected
    assert "\\boxed{{}}" in tokenizer.decode(turn.prompt_ids)
    # The training run configs use it; inference keeps the formatted prompt.
    trainer = OmegaConf.load(Path(__file__).resolve().parents[3] / "configs" / "memory_agent.yaml")
    assert trainer.recurrent.config.final_prompt == "boxed_released"
    assert MemoryConfig().final_prompt == "boxed"


def test_paper_budgets_are_the_defaults():
    config = MemoryConfig()
    assert (config.chunk_size, config.max_memorization_length, config.max_prompt_length) == (5000, 1024, 1024)
    assert (config.max_final_response_length, config.max_chunks, config.max_context_tokens) == (1024, 8, 40_000)
    assert config.final_prompt == "boxed" and config.context_key == "context"


def test_rendered_turns_fill_the_spec_prompt(tokenizer):
    workflow = MemoryWorkflow(MemoryConfig(chunk_size=50), tokenizer)
    context = "The magic number is 42. " * 20
    turn = first_turn(
        workflow, {"prompt": [{"role": "user", "content": "What is {the} magic number?"}], "context": context}
    )
    chunk_text = tokenizer.decode(tokenizer.encode(context, add_special_tokens=False)[:50])
    expected = "\n".join(SPEC_MEMORY_LINES)
    expected = expected.replace("{prompt}", "What is {the} magic number?").replace("{memory}", "No previous memory")
    assert turn.messages == [{"role": "user", "content": expected.replace("{chunk}", chunk_text)}]
    assert turn.max_tokens == 1024 and not turn.final
    # The token-level prompt is the chat template around the same text.
    chat = tokenizer.apply_chat_template(turn.messages, tokenize=False, add_generation_prompt=True)
    assert tokenizer.decode(turn.prompt_ids) == chat


def test_chunk_boundaries_and_centre_truncation_by_hand(tokenizer):
    # 10 context tokens, ids 100..109; chunk 3, at most 2 chunks -> keep the first 3 and the last 3.
    workflow = MemoryWorkflow(MemoryConfig(chunk_size=3, max_chunks=2), tokenizer)
    episode = workflow.episode_from_ids("q?", np.arange(100, 110))
    assert episode.context_ids.tolist() == [100, 101, 102, 107, 108, 109]
    assert episode.num_chunks == 2 and episode.original_context_tokens == 10
    run(episode, lambda n, turn: reply(f"memory after {n + 1}", tokenizer))
    seen = []
    for turn in [rec.turn for rec in episode.history if not rec.turn.final]:
        seen.append(turn.meta["chunk"])
        ids = turn.prompt_ids
        chunk = [100, 101, 102] if turn.meta["chunk"] == 0 else [107, 108, 109]
        starts = [i for i in range(len(ids) - 2) if ids[i : i + 3] == chunk]
        assert len(starts) == 1, "the chunk's token ids appear verbatim, once"
    assert seen == [0, 1] and episode.memory_trace == ["memory after 1", "memory after 2"]
    # Unlimited context (inference): 10 tokens in chunks of 3 -> 4 calls, the last holding one token.
    unlimited = MemoryWorkflow(MemoryConfig(chunk_size=3, max_chunks=None), tokenizer).episode_from_ids(
        "q?", np.arange(100, 110)
    )
    assert unlimited.num_chunks == 4 and unlimited.context_ids.tolist() == list(range(100, 110))


def test_memory_is_overwritten_and_final_sees_only_question_and_memory(tokenizer):
    workflow = MemoryWorkflow(MemoryConfig(chunk_size=4), tokenizer)
    episode = workflow.episode({"prompt": "Who?", "context": "alpha beta gamma delta epsilon zeta eta theta"})
    assert episode.num_chunks >= 2

    def answer(n: int, turn: Turn) -> Reply:
        if turn.final:
            return reply("\\boxed{Paris}")
        if n == 0:
            return reply("MEMORY-ONE", tokenizer)
        return reply("MEMORY-TWO", tokenizer, finish="length" if n == 1 else "stop")  # the second memory: cut

    run(episode, answer)
    first, second, turn = episode.history[0].turn, episode.history[1].turn, episode.history[-1].turn
    assert "No previous memory" in first.messages[0]["content"]
    assert "MEMORY-ONE" in second.messages[0]["content"] and "No previous memory" not in second.messages[0]["content"]
    assert turn.final and turn.max_tokens == 1024
    content = turn.messages[0]["content"]
    assert "MEMORY-TWO" in content and "MEMORY-ONE" not in content and "alpha" not in content
    assert "\\boxed{}" in content
    # The memory ids are the generated ids without eos (the fork fed the raw ids back), inside the final prompt.
    memory_ids = tokenizer.encode("MEMORY-TWO", add_special_tokens=False)
    assert memory_ids == episode.reading.memory_of(episode.history[-2].reply).ids
    ids = turn.prompt_ids
    assert any(ids[i : i + len(memory_ids)] == memory_ids for i in range(len(ids))), "in the final prompt, verbatim"
    assert episode.answer == "\\boxed{Paris}"
    trace = episode.trace()
    assert trace["memories"][:2] == ["MEMORY-ONE", "MEMORY-TWO"]
    assert trace["memory_truncated"][:2] == [False, True]  # a memory cut at its token limit is kept and flagged
    assert trace["turns"][-1]["final"] and trace["answer"] == "\\boxed{Paris}"


def test_reencoded_memory_uses_the_canonical_ids(tokenizer):
    # Generated ids need not be the canonical encoding of their text: here "ou" generated as "o", "u".
    raw = tokenizer.encode("o", add_special_tokens=False) + tokenizer.encode("u", add_special_tokens=False)
    canonical = tokenizer.encode("ou", add_special_tokens=False)
    assert raw != canonical
    for reencode, expected in ((False, raw), (True, canonical)):
        workflow = MemoryWorkflow(MemoryConfig(chunk_size=64), tokenizer, reencode_memory=reencode)
        episode = workflow.episode({"prompt": "Q?", "context": "one two three"})  # one chunk
        run(episode, lambda n, turn: Reply("ou", "stop", token_ids=raw + [tokenizer.eos_token_id]))
        assert [rec.turn.final for rec in episode.history] == [False, True]
        final = episode.history[-1].turn
        question = tokenizer.encode("Q?", add_special_tokens=False)
        assert final.prompt_ids == final_prompt_by_hand(tokenizer, SPEC_FINAL_LINES[0], question, expected)


def test_strip_think_keeps_the_conclusion_as_memory(tokenizer):
    for strip, expected in ((False, "<think>hmm</think> The number is 7."), (True, "The number is 7.")):
        episode = MemoryWorkflow(MemoryConfig(chunk_size=64, strip_think=strip), tokenizer).episode(
            {"prompt": "Q?", "context": "one two three"}
        )
        run(episode, lambda n, turn: reply("<think>hmm</think> The number is 7.", tokenizer))
        assert episode.memory_trace == [expected]
        assert f"<memory>\n{expected}\n</memory>" in episode.history[1].turn.messages[0]["content"]


def test_empty_context_answers_from_no_previous_memory(tokenizer):
    for context in ("", None):
        episode = run(MemoryWorkflow(MemoryConfig(), tokenizer).episode({"prompt": "Q?", "context": context}))
        turn = episode.history[0].turn
        assert turn.final and episode.num_chunks == 0 and len(episode.history) == 1
        assert "<memory>\nNo previous memory\n</memory>" in turn.messages[0]["content"]


def test_answer_is_variant_and_text_only_mode(tokenizer):
    workflow = MemoryWorkflow(MemoryConfig(final_prompt="answer_is"), tokenizer, token_prompts=False)
    turn = first_turn(workflow, {"prompt": "Q?", "context": ""})
    assert turn.prompt_ids is None and "Therefore, the answer is" in turn.messages[0]["content"]


def test_question_over_budget_errors_or_truncates(tokenizer):
    question = "word " * 50
    with pytest.raises(ValueError, match="max_prompt_length=8"):
        MemoryWorkflow(MemoryConfig(max_prompt_length=8), tokenizer).episode({"prompt": question, "context": "x"})
    episode = MemoryWorkflow(MemoryConfig(max_prompt_length=8, question_overflow="truncate"), tokenizer).episode(
        {"prompt": question, "context": "x"}
    )
    assert len(episode.reading.question_ids) == 8


def test_missing_columns_are_named(tokenizer):
    workflow = MemoryWorkflow(MemoryConfig(), tokenizer)
    with pytest.raises(KeyError, match="'context'"):
        workflow.episode({"prompt": "Q?"})
    with pytest.raises(KeyError, match="'prompt'"):
        workflow.episode({"context": "text"})
    with pytest.raises(ValueError, match="chunk_size"):
        MemoryConfig(chunk_size=0)


def test_an_initial_memory_column_starts_the_session_from_it(tokenizer):
    """memory_key: the first memory call and, with no chunk, the answer call read the row's memory in place of "No
    previous memory", in text and in token ids; an empty value, or no memory_key (the paper), starts empty."""
    held = "The special magic number for calm-otter is 4711."
    workflow = MemoryWorkflow(MemoryConfig(chunk_size=64, memory_key="memory"), tokenizer)
    turn = first_turn(workflow, {"prompt": "Q?", "context": "one two three", "memory": held})
    assert f"<memory>\n{held}\n</memory>" in turn.messages[0]["content"]
    assert tokenizer.decode(turn.prompt_ids) == tokenizer.apply_chat_template(
        turn.messages, tokenize=False, add_generation_prompt=True
    )
    final = first_turn(workflow, {"prompt": "Q?", "context": "", "memory": held})
    assert final.final and f"<memory>\n{held}\n</memory>" in final.messages[0]["content"]
    for row, config in (
        ({"prompt": "Q?", "context": "one", "memory": ""}, MemoryConfig(memory_key="memory")),
        ({"prompt": "Q?", "context": "one", "memory": held}, MemoryConfig()),  # the column is not read
    ):
        first = first_turn(MemoryWorkflow(config, tokenizer), row)
        assert "<memory>\nNo previous memory\n</memory>" in first.messages[0]["content"]


def test_a_bad_initial_memory_is_named(tokenizer):
    workflow = MemoryWorkflow(MemoryConfig(memory_key="memory", max_memorization_length=4), tokenizer)
    with pytest.raises(KeyError, match="'memory' \\(the initial memory\\)"):
        workflow.episode({"prompt": "Q?", "context": "x"})
    with pytest.raises(TypeError, match="must hold a string, got int"):
        workflow.episode({"prompt": "Q?", "context": "x", "memory": 7})
    with pytest.raises(ValueError, match="over max_memorization_length=4"):
        workflow.episode({"prompt": "Q?", "context": "x", "memory": "one two three four five six"})


def test_without_kept_prompts_an_episode_holds_no_past_chunks(tokenizer):
    workflow = MemoryWorkflow(MemoryConfig(chunk_size=5, max_chunks=None), tokenizer, keep_prompts=False)
    episode = workflow.episode({"prompt": "Q?", "context": "one two three four five six seven eight nine ten " * 5})
    run(episode, lambda n, turn: reply("m", tokenizer))
    assert all(rec.turn.messages == [] and rec.turn.prompt_ids is None for rec in episode.history)
    assert all(rec.reply.token_ids is None for rec in episode.history)
    assert len(episode.history) == episode.num_chunks + 1
    assert [rec.turn.meta["chunk"] for rec in episode.history[:-1]] == list(range(episode.num_chunks))


def test_the_agent_is_one_function_over_the_client(tokenizer):
    """The registered agent is an agent function like any other: its rows come from the calls it makes, the
    memory calls kind "memory" with their chunk, the answer flagged final and returned as the answer."""
    workflow = load_register("memory").for_training({"chunk_size": 4}, tokenizer)
    assert workflow.agent is memory.read_and_answer
    episode = run(workflow.episode({"prompt": "Q?", "context": "alpha beta gamma delta epsilon"}))
    kinds = [(rec.turn.meta["kind"], rec.turn.meta.get("chunk"), rec.turn.final) for rec in episode.history]
    assert kinds == [("memory", i, False) for i in range(episode.num_chunks)] + [("final", None, True)]
    assert episode.answer == "m" and episode.trace()["answer"] == "m"


def test_register_loads_by_module_and_by_file(tmp_path):
    register = load_register("recurrent.impls.memory")
    assert register.name == "memory" and register.config_cls is memory.MemoryConfig
    assert load_register("memory") is register  # by name: the module recurrent.impls.memory
    by_file = load_register(memory.__file__ + ":REGISTER")  # a fresh module: its own class objects, same names
    assert by_file.name == "memory" and by_file.config_cls.__name__ == "MemoryConfig"
    with pytest.raises(FileNotFoundError, match="nope.py"):
        load_register(str(tmp_path / "nope.py"))
    with pytest.raises(AttributeError, match="OTHER"):
        load_register("recurrent.impls.memory:OTHER")
    with pytest.raises(TypeError, match="expected a WorkflowRegistration"):
        load_register("recurrent.impls.memory:MemoryConfig")
    with pytest.raises(ModuleNotFoundError, match="no_such_module"):
        load_register("recurrent.agents.no_such_module")
