"""RULER generation with the tiny tokenizer: every task hits its target length within 2%, its answer is
where the task puts it, generation is deterministic across worker counts, and calibration is cheap."""

import json
import re
from collections import Counter

import pytest

from taskutils.memory_data import stages
from taskutils.memory_data.ruler import NIAH_TASKS, TASKS, Sources, make_task
from taskutils.memory_data.ruler.calibrate import fit_units
from taskutils.memory_data.ruler.haystack import NOISE, insert_at_depths
from taskutils.memory_data.ruler.niah import DEPTHS, NiahParams, NiahTask
from taskutils.memory_data.run import main
from taskutils.memory_data.sources import read_hotpotqa, read_squad
from taskutils.memory_data.tokenizer import count_tokens


@pytest.fixture(scope="module")
def ruler_sources(sources):
    return Sources(essay=sources["essay"], squad=sources["squad"], hotpotqa_dev=sources["hotpotqa_dev"])


def _recount(sample, task, tokenizer) -> int:
    return count_tokens(sample.input, tokenizer) + count_tokens(sample.context, tokenizer) + task.tokens_to_generate


def check_answer_placement(name: str, sample, sources: Sources) -> None:
    """The answer is in the context where the task says it is."""
    context, outputs = sample.context, sample.outputs
    if name in NIAH_TASKS:
        p = NIAH_TASKS[name]
        assert len(outputs) == p.num_values * p.num_queries
        for value in outputs:
            # each answer sits in exactly one needle whose key is one of the queried keys
            needles = re.findall(
                rf"One of the special magic {p.value_type} for (\S+) is: {re.escape(value)}\.", context
            )
            assert len(needles) == 1 and needles[0] in sample.input
        if p.haystack == "repeat":
            assert set(context.split("\n")) - {NOISE} <= set(re.findall(r"One of the special magic[^\n]+", context))
        if p.haystack == "needle":
            keys = re.findall(r"for (\S+) is:", context)
            queried = [k for k in keys if k in sample.input]
            assert len(queried) == p.num_values * p.num_queries  # no filler needle reuses a queried key
        singular = p.num_values * p.num_queries == 1
        assert sample.input.startswith("A special magic" if singular else "Some special magic")
    elif name == "vt":
        value = sample.input.split("assigned the value ")[1].split()[0]
        names = outputs
        assert len(names) == 5 and f"VAR {names[0]} = {value}" in context
        positions = [context.index(f"VAR {names[0]} = {value}")]
        positions += [context.index(f"VAR {names[j + 1]} = VAR {names[j]}") for j in range(4)]
        assert positions == sorted(positions)  # the chain appears in order
    elif name == "cwe":
        example, context = context.split("\n\n")  # the one-shot example, then the list
        assert "Question: What are the 10 most common words in the above list? Answer: The top 10" in example
        counts = Counter(re.findall(r"\d+\. (\S+)", context))
        assert {counts[w] for w in outputs} == {30}  # RULER's frequency (every length tested here is >= 4K)
        common = {counts[w] for w in outputs}
        assert len(outputs) == 10 and len(common) == 1
        assert min(common) > max(c for w, c in counts.items() if w not in outputs)
    elif name == "fwe":
        counts = Counter(context.split())
        ranked = [w for w, _ in counts.most_common() if w != "..."]
        assert ranked[:3] == outputs and counts["..."] > counts[outputs[0]]
    else:
        source = read_squad(sources.squad) if name == "qa_1" else read_hotpotqa(sources.hotpotqa_dev)
        assert any(a in context for a in outputs)
        question = next(q for q in source.questions if q.question in sample.input)
        for d in question.doc_ids:  # the gold paragraph(s), once each
            assert context.count(source.docs[d]) == 1


@pytest.mark.parametrize("name", TASKS)
def test_every_task_hits_its_target_with_the_answer_in_place(name, tiny_tokenizer, ruler_sources):
    # cwe's smallest list (10 words x 30, plus the one-shot example) takes ~5K tokens of the tiny test tokenizer,
    # which spends ~10 tokens on "123. word" (Qwen's ~4 fit it in ~2K): it starts at 8K here.
    for length in (8192, 16384) if name == "cwe" else (4096, 16384):
        task = make_task(name, length, 42, tiny_tokenizer, ruler_sources)
        for index in (0, 1):
            sample, tokens = task.generate(index)
            assert tokens == _recount(sample, task, tiny_tokenizer)
            assert 0.98 * length <= tokens <= length, (name, length, tokens)
            check_answer_placement(name, sample, ruler_sources)


@pytest.mark.parametrize("name", ["niah_multivalue", "qa_2", "cwe"])
def test_64k_samples(name, tiny_tokenizer, ruler_sources):
    task = make_task(name, 65536, 42, tiny_tokenizer, ruler_sources)
    sample, tokens = task.generate(3)
    assert 0.98 * 65536 <= tokens <= 65536
    check_answer_placement(name, sample, ruler_sources)


def test_cwe_beyond_the_official_word_list_takes_english_words(tiny_tokenizer, ruler_sources):
    from taskutils.memory_data.ruler.cwe_fwe import wonderwords_words

    # wonderwords' ~8,700 words at 3 repeats cannot fill the length (with Qwen's tokenizer from ~100K tokens; the
    # tiny test tokenizer spends more tokens per entry, ~265K): the long-length source takes over, and the task
    # stays RULER's (30 and 3 repeats) instead of multiplying the frequencies.
    length = 320 * 1024
    task = make_task("cwe", length, 42, tiny_tokenizer, ruler_sources)
    sample, tokens = task.generate(0)
    assert 0.98 * length <= tokens <= length and sample.extra["word_source"] == "english-words web2"
    example, listing = sample.context.split("\n\n")
    counts = Counter(re.findall(r"\d+\. (\S+)", listing))
    assert {counts[w] for w in sample.outputs} == {30} and set(counts.values()) == {30, 3}
    assert not set(counts) <= set(wonderwords_words())  # words beyond the official list
    example_counts = Counter(re.findall(r"\d+\. (\S+)", example.split("\nQuestion:")[0]))
    assert len(example_counts) == 40 and sorted(set(example_counts.values())) == [3, 10]
    assert not set(example_counts) & set(counts)  # the example's words are not the list's
    short = make_task("cwe", 8192, 42, tiny_tokenizer, ruler_sources).generate(0)[0]
    assert short.extra["word_source"] == "wonderwords"


def test_cwe_words_are_the_official_sources():
    from taskutils.memory_data.ruler.cwe_fwe import english_words, wonderwords_words

    words = wonderwords_words()
    assert len(words) == len(set(words)) > 8_000 and words == tuple(sorted(words))
    assert {"apple", "happy"} <= set(words)  # a noun, an adjective of wonderwords' lists
    assert len(english_words()) > 200_000 and all(w == w.lower() for w in english_words()[:1000])


def test_essay_needles_sit_between_sentences(tiny_tokenizer, ruler_sources):
    task = make_task("niah_multikey_1", 8192, 42, tiny_tokenizer, ruler_sources)
    sample, _ = task.generate(0)
    needles = list(re.finditer(r"One of the special magic numbers for \S+ is: \d+\.", sample.context))
    assert len(needles) == 4  # niah_multikey_1: 4 keys, one value each (RULER's num_needle_k=4)
    for match in needles:
        before = sample.context[: match.start()].rstrip()
        assert before == "" or before[-1] in ".!?:\"'"


# Needle depths on a haystack whose sentence starts are known by hand: 100 sentences of 16 characters joined by
# single spaces, so sentence k starts at character 17k and the text is 1,699 characters long.
SENTENCE = "The sky is blue."
EVEN_ESSAY = " ".join([SENTENCE] * 100)
NEEDLE_RE = re.compile(r"One of the special magic \S+ for \S+ is: \S+\.")


def test_insert_at_depths_puts_each_needle_at_its_depth_from_0_to_100_percent():
    # The generator's rule: depth d aims at character round(1699 * d / 100) and the needle goes to the nearest
    # sentence start (the text's end counts as one). For a whole d that target is within 0.01 d + 0.5 < 8.5
    # characters of 17 d, so the needle has exactly d sentences before it: 0 at 0%, all 100 at 100%.
    depths = list(range(101))
    needles = [f"Needle {d}." for d in depths]
    context = insert_at_depths(EVEN_ESSAY, depths, needles)
    for d in depths:
        before = context[: context.index(f"Needle {d}.")]
        assert before.count(SENTENCE) == d, d
    assert context.startswith("Needle 0. The sky") and context.endswith("is blue. Needle 100.")
    assert context.count(SENTENCE) == 100  # every sentence kept whole


ESSAY_TASKS = [name for name, p in NIAH_TASKS.items() if p.haystack == "essay"]
LINE_TASKS = {name: p for name, p in NIAH_TASKS.items() if p.haystack != "essay"}
# The official line-haystack tasks have one needle each; these also check the insertion order of several.
LINE_TASKS |= {f"{h}_4_keys": NiahParams(h, "words", "numbers", num_keys=4) for h in ("repeat", "needle")}


def test_essay_needles_land_at_their_drawn_depths_over_the_whole_range():
    seen = set()
    for name in ESSAY_TASKS:
        task = NiahTask(name, 4096, 42, None, NIAH_TASKS[name], essay=EVEN_ESSAY)
        for index in range(40):
            sample = task.build(index, 400)  # 400 words: the 100 sentences once
            # The draw, as the generator makes it: after the needles, k of the 40 depths (no repeats),
            # depths[i] for needles[i].
            rng, _, needles, _, _ = task._needles(index)
            drawn = rng.sample(DEPTHS, len(needles))
            found = {m.group(): sample.context[: m.start()].count(SENTENCE) for m in NEEDLE_RE.finditer(sample.context)}
            assert found == dict(zip(needles, drawn, strict=True)), (name, index)
            seen.update(drawn)
    assert seen == set(DEPTHS) and min(seen) == 0 and max(seen) == 100  # every depth, both ends included


@pytest.mark.parametrize("name", sorted(LINE_TASKS))
def test_line_needles_land_at_their_drawn_positions_over_the_whole_range(name):
    # repeat and needle haystacks: n lines, and each needle goes before one of them, at positions drawn (as
    # RULER draws them) from range(n), so the i-th needle down the context has the i-th smallest position's
    # count of haystack lines above it: 0 (the top) to n - 1 (just above the last line).
    params, n = LINE_TASKS[name], 10
    task = NiahTask(name, 4096, 42, None, params)
    seen = set()
    for index in range(80):
        lines = task.build(index, n).context.split("\n")
        needles = set(task._needles(index)[2])
        assert len(lines) == n + len(needles)
        drawn = sorted(task.rng(index, "positions", n).sample(range(n), len(needles)))
        above = [i - j for j, i in enumerate(i for i, line in enumerate(lines) if line in needles)]
        assert above == drawn, (index, above, drawn)
        seen.update(above)
    assert seen == set(range(n))


def test_samples_differ_by_index_and_seed(tiny_tokenizer, ruler_sources):
    task = make_task("niah_single_2", 4096, 42, tiny_tokenizer, ruler_sources)
    other_seed = make_task("niah_single_2", 4096, 43, tiny_tokenizer, ruler_sources)
    a, b, c = task.generate(0)[0], task.generate(1)[0], other_seed.generate(0)[0]
    assert a.outputs != b.outputs and a.outputs != c.outputs
    assert task.generate(0)[0] == a


def test_ruler_file_is_identical_for_one_and_two_workers(tmp_path, tiny_tokenizer, ruler_sources):
    outputs = []
    for workers in (1, 2):
        report = stages.ruler(
            tmp_path / f"w{workers}", "qa_2", 4096, tiny_tokenizer, "tiny", 4, 42, ruler_sources, workers, False
        )
        outputs.append(report.output.read_bytes())
    assert outputs[0] == outputs[1]
    records = [json.loads(line) for line in outputs[0].decode().splitlines()]
    assert [r["index"] for r in records] == [0, 1, 2, 3]
    assert {"index", "input", "context", "outputs", "length"} <= set(records[0])


def test_calibration_needs_few_tokenizations():
    # tokens = 300 + 7.3 n: the probe line is a bit off, as on real text; 2-3 exact counts must do.
    def build(n):
        return None, int(300 + 7.3 * n)

    fit = fit_units(build, 131072, intercept=250, slope=7.0)
    assert 0.995 * 131072 <= fit.tokens <= 131072 and fit.evaluations <= 3
    coarse = fit_units(lambda n: (None, 100 + 300 * n), 4096, intercept=100, slope=250)  # units of 300 tokens
    assert coarse.tokens == 100 + 300 * 13


def test_cli_writes_the_harness_file_names(tmp_path, tiny_model_dir, sources, capsys):
    argv = ["ruler", "--out", str(tmp_path), "--tasks", "vt", "niah_single_1", "--lengths", "4096"]
    argv += ["--tokenizer", tiny_model_dir, "--num-samples", "2", "--essay-file", str(sources["essay"])]
    assert main(argv) == 0
    assert (tmp_path / "eval_vt_4096.jsonl").is_file() and (tmp_path / "eval_niah_single_1_4096.jsonl").is_file()
    assert main(["ruler", "--out", str(tmp_path), "--tasks", "nope"]) == 2
    assert main(["ruler", "--out", str(tmp_path / "x"), "--tasks", "vt", "--tokenizer", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err
    assert "unknown tasks" in err and "cannot load tokenizer" in err
    # a task whose source file is missing is refused before anything is written
    missing = ["ruler", "--out", str(tmp_path / "y"), "--tasks", "qa_1", "--lengths", "4096", "--tokenizer"]
    assert main([*missing, tiny_model_dir, "--squad-file", str(tmp_path / "no-squad.json")]) == 2
    assert "no-squad.json: file not found" in capsys.readouterr().err
