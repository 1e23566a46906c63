"""HotpotQA synthesis: pool, samples (gold paragraphs, counts, format), parquet layout, eval sets,
determinism across worker counts, and bad source files."""

import json
import re

import pyarrow.parquet as pq
import pytest

from taskutils.memory_data import hotpotqa, stages
from taskutils.memory_data.hotpotqa import SynthesisConfig, TooFewDocumentsError, pick_documents
from taskutils.memory_data.sources import SourceError, hotpotqa_doc, read_essay, read_hotpotqa, read_squad

DOC_LABEL = re.compile(r"(?:^|\n\n)Document (\d+):\n")


def _docs_of(context: str) -> list[str]:
    """Split a context back into its documents, checking the 1..N labels."""
    labels = [int(m) for m in DOC_LABEL.findall(context)]
    assert labels == list(range(1, len(labels) + 1))
    return [part for part in DOC_LABEL.split(context)[2::2]]


def test_pool_is_sorted_unique_documents(sources):
    data = read_hotpotqa(sources["hotpotqa_dev"])
    raw = json.loads(sources["hotpotqa_dev"].read_text())
    assert data.docs == sorted(set(data.docs))
    # 40 questions x 10 paragraphs, 3 of them shared ("Common k") -> 9 own each + 3 shared
    assert len(data.docs) == 40 * 9 + 3
    first = data.questions[0]
    assert [data.docs[d] for d in first.doc_ids] == [hotpotqa_doc(t, s) for t, s in raw[0]["context"]]
    assert first.answers == [raw[0]["answer"]]
    # sentences are concatenated without separators: they carry their own leading spaces
    assert hotpotqa_doc("T", ["A b.", " C d."]) == "T\nA b. C d."


def test_sample_holds_own_paragraphs_plus_distinct_distractors(sources):
    data = read_hotpotqa(sources["hotpotqa_dev"])
    for n in (10, 50, 200, len(data.docs)):
        for q in data.questions[:5]:
            ids = pick_documents(q, len(data.docs), SynthesisConfig("dev", n, seed=42))
            assert len(ids) == n
            assert set(q.doc_ids) <= set(ids)
            assert len(set(ids)) == n  # no document twice
    q = data.questions[0]
    cfg = SynthesisConfig("dev", 200, seed=42)
    assert pick_documents(q, len(data.docs), cfg) == pick_documents(q, len(data.docs), cfg)
    assert pick_documents(q, len(data.docs), cfg) != pick_documents(q, len(data.docs), SynthesisConfig("dev", 200, 7))


def test_original_fixed_shuffle_puts_own_paragraphs_at_fixed_positions(sources):
    # The original re-creates Random(4) per sample: the permutation depends on N only (documented quirk).
    data = read_hotpotqa(sources["hotpotqa_dev"])

    def own_positions(q, per_sample):
        ids = pick_documents(q, len(data.docs), SynthesisConfig("dev", 100, 42, per_sample))
        return sorted(ids.index(d) for d in q.doc_ids)

    fixed = {tuple(own_positions(q, False)) for q in data.questions[:10]}
    free = {tuple(own_positions(q, True)) for q in data.questions[:10]}
    assert len(fixed) == 1 and len(free) > 1


def test_too_few_documents_is_refused(tmp_path, sources):
    data = read_hotpotqa(sources["hotpotqa_dev"])
    with pytest.raises(TooFewDocumentsError, match="pool has only"):
        pick_documents(data.questions[0], len(data.docs), SynthesisConfig("dev", len(data.docs) + 1))
    with pytest.raises(TooFewDocumentsError):
        stages.hotpotqa_eval(tmp_path, sources["hotpotqa_dev"], [0], [10_000])
    assert not list(tmp_path.iterdir())  # refused before anything was written


def test_training_parquet_layout(tmp_path, sources):
    report = stages.hotpotqa_process(tmp_path, "dev", sources["hotpotqa_dev"], num_samples=12, num_docs=50)
    path = tmp_path / "hotpotqa_dev_process.parquet"
    assert report.output == path and not (tmp_path / "hotpotqa_dev_process.parquet.partial").exists()
    table = pq.read_table(path)
    assert table.column_names == ["data_source", "prompt", "context", "ability", "reward_model", "extra_info"]
    rows = table.to_pylist()
    assert len(rows) == 12
    data = read_hotpotqa(sources["hotpotqa_dev"])
    for i, row in enumerate(rows):
        q = data.questions[i]
        assert row["data_source"] == "hotpotqa" and row["ability"] == "memory"
        assert row["prompt"] == [{"role": "user", "content": q.question}]
        assert row["reward_model"] == {"style": "rule", "ground_truth": q.answers}
        assert row["extra_info"] == {"index": i, "question": q.question, "num_docs": 50}
        docs = _docs_of(row["context"])
        assert len(docs) == 50
        for d in q.doc_ids:  # both gold paragraphs and the 8 HotpotQA distractors
            assert data.docs[d] in docs
    # verl's dataset reads the parquet through `datasets`
    datasets = pytest.importorskip("datasets")
    loaded = datasets.load_dataset("parquet", data_files=str(path), split="train")
    assert loaded[0]["reward_model"]["ground_truth"] == rows[0]["reward_model"]["ground_truth"]


def test_same_output_for_one_and_two_workers(tmp_path, sources):
    one = stages.hotpotqa_process(tmp_path / "w1", "train", sources["hotpotqa_train"], 20, 40, workers=1).output
    two = stages.hotpotqa_process(tmp_path / "w2", "train", sources["hotpotqa_train"], 20, 40, workers=2).output
    assert pq.read_table(one).equals(pq.read_table(two))
    e1 = stages.hotpotqa_eval(tmp_path / "e1", sources["hotpotqa_dev"], [3, 1, 4], [60], workers=1)[0].output
    e2 = stages.hotpotqa_eval(tmp_path / "e2", sources["hotpotqa_dev"], [3, 1, 4], [60], workers=2)[0].output
    assert e1.read_bytes() == e2.read_bytes()


def test_eval_sets_layout_and_consistency(tmp_path, sources):
    data = read_hotpotqa(sources["hotpotqa_dev"])
    indices = [5, 0, 9, 2]
    counts = [10, 50, 200, len(data.docs)]
    reports = stages.hotpotqa_eval(tmp_path, sources["hotpotqa_dev"], indices, counts)
    assert [r.output.name for r in reports] == [f"eval_{n}.jsonl" for n in counts]
    for n, report in zip(counts, reports, strict=True):
        records = [json.loads(line) for line in report.output.read_text().splitlines()]
        assert [r["index"] for r in records] == indices  # the same questions at every length
        for record in records:
            assert set(record) == {"index", "input", "context", "answers", "num_docs"}
            q = data.questions[record["index"]]
            assert record["input"] == q.question and record["answers"] == q.answers and record["num_docs"] == n
            docs = _docs_of(record["context"])
            assert len(docs) == n and all(data.docs[d] in docs for d in q.doc_ids)
    # eval_200 and the dev parquet at 200 documents draw the same documents for a question
    stages.hotpotqa_process(tmp_path / "p", "dev", sources["hotpotqa_dev"], 10, 200)
    row = pq.read_table(tmp_path / "p" / "hotpotqa_dev_process.parquet").to_pylist()[5]
    record = json.loads((tmp_path / "eval_200.jsonl").read_text().splitlines()[0])
    assert record["context"] == row["context"]


def test_eval_questions_come_from_the_filtered_dev_parquet(tmp_path, sources):
    stages.hotpotqa_process(tmp_path, "dev", sources["hotpotqa_dev"], 6, 20)
    assert hotpotqa.question_indices_from_parquet(tmp_path / "hotpotqa_dev_process.parquet") == list(range(6))


# -- bad source files ---------------------------------------------------------------------------------------


def test_truncated_source_names_the_file(tmp_path, sources):
    cut = tmp_path / "hotpotqa_dev.json"
    cut.write_text(sources["hotpotqa_dev"].read_text()[:5000])
    with pytest.raises(SourceError, match=r"hotpotqa_dev\.json.*not valid JSON"):
        read_hotpotqa(cut)
    with pytest.raises(SourceError, match="file not found"):
        read_hotpotqa(tmp_path / "missing.json")


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda r: r.pop("answer"), "missing field 'answer'"),
        (lambda r: r.__setitem__("context", [["title only"]]), r"context\[0\] is not \[title, \[sentences\]\]"),
        (lambda r: r.__setitem__("context", []), "empty context"),
    ],
)
def test_malformed_hotpotqa_record_names_file_and_record(tmp_path, sources, mutate, message):
    records = json.loads(sources["hotpotqa_dev"].read_text())
    mutate(records[7])
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(records))
    with pytest.raises(SourceError, match=rf"bad\.json: record 7 \(_id='{records[7]['_id']}'\): {message}"):
        read_hotpotqa(path)


def test_malformed_squad_and_essay(tmp_path, sources):
    data = json.loads(sources["squad"].read_text())
    data["data"][1]["paragraphs"][2]["qas"][0]["answers"] = []
    path = tmp_path / "squad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(SourceError, match="article 1 paragraph 2 question 0"):
        read_squad(path)
    assert len(read_squad(sources["squad"]).questions) == 4 * 5  # unanswerable ones are skipped
    essay = tmp_path / "essay.json"
    essay.write_text(json.dumps({"essays": "no text key"}))
    with pytest.raises(SourceError, match="essay.json"):
        read_essay(essay)
