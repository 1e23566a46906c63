"""The choosing task's warm start (docs/replication_cpu_notebook.md, "The choosing task"): its naive teacher's memory
targets, worked by hand on hand-built chunks and a hand-built document, its documents, and its place in the model cache
beside the needle task's (a micro build of a few seconds of CPU)."""

import json
import random
import re

import pytest

from experiments.needle.needle import NEEDLE, NEEDLE_RE, QUESTION, chunk_texts
from experiments.needle.reader import build_tokenizer
from experiments.needle.warm_start import (
    CHOOSE,
    CHOOSE_RECALL,
    CHOOSE_RECIPE_VERSION,
    FORMS,
    RECIPE_VERSION,
    ChooseScale,
    Scale,
    agent_config,
    cached_warm_start,
    choice_rows,
    choice_write,
    teacher_document,
    teacher_transcript,
    whole_needles,
)
from recurrent.impls.memory import MemoryWorkflow
from recurrent.models import MANIFEST
from recurrent.tokens import encode_long

ASKED = NEEDLE.format(key="brave-otter", value="4821")
B = NEEDLE.format(key="brave-tiger", value="7350")
C = NEEDLE.format(key="calm-falcon", value="1296")
D = NEEDLE.format(key="dark-lemon", value="5555")
F1, F2 = "The farmer walked to the red barn.", "A small dog found an old map."
DOC = {"needle": ASKED}


def as_form(text, form):
    """A needle sentence as the teacher of ``form`` writes it (number: its number); anything else as it is."""
    match = NEEDLE_RE.fullmatch(text)
    return match.group(2) if match and form == "number" else text


@pytest.fixture(params=FORMS)
def write(request):
    """The teacher of one form on hand-built chunks: the memory given, and the memory expected, in that form."""
    form = request.param

    def run(memory, sentences, p_needle, p_keep):
        return choice_write(DOC, as_form(memory, form), sentences, random.Random(0), p_needle, p_keep, form)

    run.form = form
    return run


def expect(write, text):
    return as_form(text, write.form)


def test_the_recall_recipe_writes_numbers_the_first_recipe_sentences():
    assert (CHOOSE.form, CHOOSE_RECALL.form) == ("sentence", "number")
    assert (CHOOSE.recall, CHOOSE.choice, CHOOSE_RECALL.recall, CHOOSE_RECALL.choice) == (0, 200, 8000, 0)
    assert choice_write(DOC, "", [F1, ASKED], random.Random(0), 1.0, 1.0) == ASKED
    with pytest.raises(ValueError, match="unknown memory form"):
        choice_write(DOC, "", [ASKED], random.Random(0), 1.0, 1.0, "key")


def test_on_the_asked_needles_chunk_it_writes_the_asked_one_or_another_needle_shown_so_far(write):
    assert write("", [F1, ASKED, C], 1.0, 1.0) == expect(write, ASKED)
    assert write(B, [F1, ASKED, C], 1.0, 0.0) == expect(write, ASKED)
    # else: the chunk's first other needle, before the one in memory
    assert write(B, [F1, C, ASKED, D], 0.0, 1.0) == expect(write, C)
    # no other needle in the chunk: the one in memory; none shown yet: the chunk's first filler sentence
    assert write(B, [F1, ASKED, F2], 0.0, 1.0) == expect(write, B)
    assert write("", [ASKED, F1, F2], 0.0, 1.0) == F1
    assert write(F2, [ASKED, F1], 0.0, 1.0) == F1


def test_on_a_chunk_of_other_needles_only_the_asked_one_is_kept_the_others_give_way(write):
    assert write(ASKED, [F1, C, D], 0.0, 1.0) == expect(write, ASKED)
    assert write(ASKED, [F1, C, D], 1.0, 0.0) == expect(write, C)  # not kept: the chunk's first needle
    assert write(B, [F1, C, D], 1.0, 1.0) == expect(
        write, C
    )  # another key's needle in memory: the newest needle replaces it
    assert write("", [D, F1], 1.0, 1.0) == expect(write, D)


def test_on_a_chunk_without_needles_a_needle_in_memory_is_kept_or_dropped_for_filler(write):
    assert write(ASKED, [F1, F2], 0.0, 1.0) == expect(write, ASKED)
    assert write(B, [F1, F2], 0.0, 1.0) == expect(write, B)
    assert write(B, [F1, F2], 1.0, 0.0) == F1
    assert write(F2, [F1, F2], 1.0, 1.0) == F1  # a filler sentence in memory is not kept


# A 3-chunk document built by hand: chunk 0 holds B, chunk 1 the asked needle and then C, chunk 2 filler only.
FILLER = [
    "The farmer walked to the red barn.",
    "The baker painted a tall tree after lunch.",
    "A small dog found an old map.",
    "The pilot opened the blue house at noon.",
    "Our guide cleaned the school on Sunday.",
    "The mayor bought a warm coat.",
    "My neighbor watched the morning train.",
    "The captain carried a heavy bag.",
    "The teacher visited the city market.",
    "Her brother repaired a broken clock.",
    "The children opened an empty box.",
    "The doctor found the stone bridge.",
]
CONTEXT = " ".join([*FILLER[0:1], B, *FILLER[1:7], ASKED, C, *FILLER[7:12], FILLER[1], FILLER[2]])
HAND_DOC = {
    "key": "brave-otter",
    "value": "4821",
    "needle": ASKED,
    "question": QUESTION.format(key="brave-otter"),
    "context": CONTEXT,
}


@pytest.fixture(scope="module")
def workflow():
    return MemoryWorkflow(agent_config(), build_tokenizer())


def test_the_hand_built_document_has_the_chunks_the_expectations_assume(workflow):
    texts = chunk_texts(encode_long(CONTEXT, workflow.tokenizer), workflow.tokenizer)
    assert len(texts) == 3
    assert B in texts[0] and ASKED not in texts[0] and C not in texts[0]
    assert texts[1].index(ASKED) < texts[1].index(C)
    assert "magic" not in texts[2] and FILLER[1] in texts[2]


@pytest.mark.parametrize(
    ("p_needle", "p_keep", "memories", "answer"),
    [
        (1.0, 1.0, [B, ASKED, ASKED], "\\boxed{4821}"),  # the asked needle written and kept: right
        (0.0, 1.0, [B, C, C], "\\boxed{1296}"),  # another needle of the chunk written instead: C's number
        (1.0, 0.0, [B, ASKED, FILLER[1]], None),  # written, then dropped for chunk 2's first sentence
        (0.0, 0.0, [B, C, FILLER[1]], None),
    ],
)
@pytest.mark.parametrize("form", FORMS)
def test_the_teachers_memory_after_each_chunk_of_a_hand_built_document(
    workflow, p_needle, p_keep, memories, answer, form
):
    turns = teacher_transcript(workflow, HAND_DOC, random.Random(0), p_needle, p_keep, task="choose", form=form)
    assert [kind for kind, _, _ in turns] == ["memory"] * 3 + ["final"]
    assert [text for _, _, text in turns[:3]] == [as_form(m, form) for m in memories]
    final = turns[-1][2]
    if answer is None:  # no needle in memory: a random 4-digit guess of the train split
        assert re.fullmatch(r"\\boxed\{\d{4}\}", final)
    else:
        assert final == answer
    tokenizer = workflow.tokenizer
    assert [target for _, (_, target), _ in turns] == [
        tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id] for _, _, text in turns
    ]
    again = teacher_transcript(workflow, HAND_DOC, random.Random(0), p_needle, p_keep, task="choose", form=form)
    assert again == turns


def test_the_naive_stages_documents_cycle_lengths_and_distractors(workflow):
    rng = random.Random("curriculum")
    docs = [teacher_document(rng, workflow.tokenizer, i, "choose") for i in range(6)]
    assert [d["num_chunks"] for d in docs] == [1, 2, 3, 4, 1, 2]
    assert [len(d["distractors"]) for d in docs] == [1, 2, 3, 1, 2, 3]
    needle_doc = teacher_document(random.Random("curriculum"), workflow.tokenizer, 2)
    assert needle_doc["num_chunks"] == 3 and "distractors" not in needle_doc


def test_the_choice_stage_copies_one_whole_needle_of_the_chunk(workflow):
    tokenizer = workflow.tokenizer
    pattern = r"The special magic number for \S+ is \d{4}\."
    rows = choice_rows(workflow, random.Random("choice"), 3)
    held = choice_rows(workflow, random.Random("choice"), 3, held=True)  # the same documents and draws
    for (prompt, target), (held_prompt, held_target), others in zip(rows, held, (1, 2, 3), strict=True):
        text = tokenizer.decode(prompt)
        found = re.findall(pattern, text[text.index("<section>") :])
        assert len(found) == 1 + others and target[-1] == tokenizer.eos_token_id
        assert tokenizer.decode(target[:-1]) in found
        # held out: the target up to the key's first word is prompt, the rest of that needle is the target
        assert held_prompt + held_target == prompt + target
        assert tokenizer.decode(held_prompt[len(prompt) :]) == tokenizer.decode(target[:-1]).split("-")[0]


def test_whole_needles_counts_exact_needle_sentences_among_the_memories_that_mention_one():
    from types import SimpleNamespace

    doc = {"needle": ASKED, "distractors": [{"key": "brave-tiger", "value": "7350"}]}
    blend = "The special magic number for brave-tiger is 4821."  # B's key with the asked needle's number
    sessions = [SimpleNamespace(memory_trace=[F1, B, blend]), SimpleNamespace(memory_trace=[ASKED, ASKED + " "])]
    # four memories mention a magic number; B and the asked needle twice are whole (spaces around do not count)
    assert whole_needles(sessions, [doc, doc]) == {"needle_memories": 4, "whole_needle": 0.75, "asked_needle": 0.5}
    # bare numbers: a needle's number is whole, the asked one's is asked; a number of no needle is a mention only
    numbers = [SimpleNamespace(memory_trace=["7350", " 4821", "4822", F1])]
    assert whole_needles(numbers, [doc]) == {"needle_memories": 3, "whole_needle": 0.667, "asked_needle": 0.333}
    assert whole_needles([SimpleNamespace(memory_trace=[F1])], [doc]) == {
        "needle_memories": 0,
        "whole_needle": 0.0,
        "asked_needle": 0.0,
    }


MICRO_CHOOSE = ChooseScale(
    "replication-reader-choose-test",
    steps=(3, 2, 2, 2),
    pools=(8, 8, 4),
    held=(8, 4, 4, 2),
    batch=4,
    choice=2,
    choice_rows=(8, 4),
    recall=2,
    recall_held=4,
)
MICRO_NEEDLE = Scale("replication-reader-test", steps=(3, 2, 2, 2), pools=(8, 8, 4), held=(8, 4, 4, 2), batch=4)


def test_the_choosing_build_has_its_own_cache_entry_and_reuses_the_copy_stages(tmp_path):
    lines: list[str] = []
    folder = cached_warm_start(tmp_path, scale=MICRO_CHOOSE, task="choose", log=lines.append)
    assert folder.name == "replication-reader-choose-test"
    manifest = json.loads((folder / MANIFEST).read_text())
    assert manifest["recipe"] == CHOOSE_RECIPE_VERSION
    assert (manifest["task"], manifest["copy_recipe"], manifest["distractors"]) == ("choose", RECIPE_VERSION, 3)
    assert (manifest["choice"], manifest["choice_rows"], manifest["recall"], manifest["form"]) == (
        2,
        [8, 4],
        2,
        "sentence",
    )
    recipe = json.loads((folder / "warm_start.json").read_text())
    assert recipe["task"] == "choose"
    assert [s["stage"] for s in recipe["stages"]] == ["synth", "needle", "paper", "recall", "choice", "naive"]
    assert [s["steps"] for s in recipe["stages"]] == [3, 2, 2, 2, 2, 2]
    copy_dir = tmp_path / "replication-reader-test-copy-stages"
    assert (copy_dir / "copy_stages.json").is_file()
    # the needle task's build beside it: another folder and manifest; a forced rebuild of the choosing one reuses the
    # kept copy stages and trains only its own three
    needle = cached_warm_start(tmp_path, scale=MICRO_NEEDLE, log=lambda _: None)
    assert needle != folder and "task" not in json.loads((needle / MANIFEST).read_text())
    rebuilt: list[str] = []
    cached_warm_start(tmp_path, scale=MICRO_CHOOSE, task="choose", force=True, log=rebuilt.append)
    assert [line.split(":")[0] for line in rebuilt if line.startswith("stage")] == [
        "stages 1-3",
        "stage 4/6 recall",
        "stage 5/6 choice",
        "stage 6/6 naive",
    ]
    with pytest.raises(ValueError, match="unknown task"):
        cached_warm_start(tmp_path, task="haystack")


def test_the_recall_recipe_builds_its_own_entry_with_a_recall_stage_and_number_memories(tmp_path):
    folder = cached_warm_start(tmp_path, quick=True, task="choose", recipe="recall", log=lambda _: None)
    assert folder.name == "replication-reader-choose-recall-quick"
    recipe = json.loads((folder / "warm_start.json").read_text())
    assert [s["stage"] for s in recipe["stages"]] == ["synth", "needle", "paper", "recall", "naive"]
    assert (recipe["scale"]["form"], recipe["scale"]["choice"]) == ("number", 0)
    # the copy stages are those of the choice recipe's quick build: one folder for both
    assert (tmp_path / "replication-reader-quick-copy-stages" / "copy_stages.json").is_file()
    with pytest.raises(ValueError, match="unknown recipe"):
        cached_warm_start(tmp_path, task="choose", recipe="oracle")


def test_the_command_refuses_a_recall_recipe_for_the_needle_task(capsys):
    from experiments.needle.warm_start import main

    with pytest.raises(SystemExit) as exit_:
        main(["--cache", "--recipe", "recall"])
    assert exit_.value.code == 2 and "--recipe recall is a recipe of the choosing task" in capsys.readouterr().err


def test_the_naive_stage_replays_the_given_share_of_choice_rows_and_none_by_default():
    from experiments.needle.warm_start.stages import replaying

    naive = [([i], [i]) for i in range(100)]
    choice = [([1000 + i], [1000 + i]) for i in range(100)]
    asked: list[int] = []

    def replay(n):  # an earlier stage's draw: records how many rows it was asked for
        asked.append(n)
        return random.Random(n).sample(choice, n)

    # a quarter of 8 is 2: the first two rows drawn are choice rows, the other six naive rows, all distinct
    rows = replaying(random.Random(7), naive, replay, 0.25)(8)
    assert asked == [2] and [r[0][0] >= 1000 for r in rows] == [True, True] + [False] * 6
    assert len({r[0][0] for r in rows}) == 8
    # share 0 is the stage without replay: the replay is never drawn from, and the naive draws are those of the pool
    # alone with the same stream
    assert replaying(random.Random(7), naive, replay, 0.0)(8) == random.Random(7).sample(naive, 8)
    assert replaying(random.Random(7), naive, None, 0.0)(8) == random.Random(7).sample(naive, 8)
    assert asked == [2]
    assert (CHOOSE.naive_replay, CHOOSE.choice_fresh) == (0.0, False)  # the recipe's defaults: a pool, no replay


def test_fresh_choice_rows_are_new_documents_every_draw(workflow):
    from dataclasses import replace

    from experiments.needle.warm_start.stages import Build, choose_stages

    lines: list[str] = []
    for fresh in (False, True):
        build = Build(replace(MICRO_CHOOSE, recall=0, choice_fresh=fresh), 0, 0.9, "choose", "keys", lines.append)
        sample = choose_stages(build)
        draws = [tuple(map(tuple, row)) for _ in range(6) for row in sample(4)]
        # the pool has 8 rows (MICRO_CHOOSE.choice_rows): 24 draws repeat rows; fresh documents do not repeat
        assert (len(set(draws)) <= 8) == (not fresh)
        assert fresh is False or len(set(draws)) == 24


def test_a_build_refuses_replay_without_a_choice_stage(tmp_path):
    from dataclasses import replace

    from experiments.needle.warm_start import train

    micro = replace(MICRO_CHOOSE, choice=0, recall=0, naive_replay=0.5)
    with pytest.raises(ValueError, match="naive_replay 0.5: the naive stage replays the choice stage's rows"):
        train(micro, task="choose", log=lambda _: None)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--out", "x", "--naive-replay", "0.5"], "--naive-replay replays the choice stage's rows"),
        (["--out", "x", "--task", "choose", "--naive-replay", "1.5"], "--naive-replay 1.5: a share of each batch"),
        (["--cache", "--task", "choose", "--naive-replay", "0.5"], "--naive-replay go with --out"),
        (["--out", "x", "--choice-fresh"], "--choice-fresh is the choice stage's: give --task choose"),
        (["--cache", "--task", "choose", "--choice-fresh"], "--choice-fresh"),
    ],
)
def test_the_command_refuses_a_replay_it_cannot_make(capsys, argv, message):
    from experiments.needle.warm_start import main

    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2 and message in capsys.readouterr().err
