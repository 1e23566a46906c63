"""Readers for the public source files, with errors that name the file and the record.

- HotpotQA (train v1.1 / dev distractor): a JSON list of ``{_id, question, answer, supporting_facts,
  context: [[title, [sentences]]], type, level}``. A document is ``"{title}\\n" + "".join(sentences)`` (the
  sentences carry their own leading spaces); the pool is the sorted set of unique documents of the file.
- SQuAD v2 dev: ``{"data": [{"title", "paragraphs": [{"context", "qas": [{"question", "id", "answers",
  "is_impossible"}]}]}]}``; answerable questions only; a document is a paragraph.
- Essays (Paul Graham): ``{"text": all essays concatenated}``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path


class SourceError(ValueError):
    """A source file is missing, malformed or incomplete."""


@dataclass(frozen=True)
class Question:
    index: int  # position in the source file (answerable questions only, for SQuAD)
    question: str
    answers: list[str]
    doc_ids: list[int]  # the question's own documents (HotpotQA: 2 gold + 8 distractors; SQuAD: its paragraph)
    more_doc_ids: list[int] = field(default_factory=list)  # SQuAD: the article's other paragraphs
    qid: str = ""


@dataclass
class QASource:
    """Questions plus the document pool they index into."""

    path: Path
    questions: list[Question]
    docs: list[str]


def _load_json(path: str | Path):
    path = Path(path)
    if not path.is_file():
        raise SourceError(f"{path}: file not found (run: python -m taskutils.memory_data download)")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as err:
        raise SourceError(f"{path}: not valid JSON ({err}); is the download incomplete?") from err


def hotpotqa_doc(title: str, sentences: list[str]) -> str:
    return f"{title}\n{''.join(sentences)}"


def read_hotpotqa(path: str | Path) -> QASource:
    """Questions and document pool of a HotpotQA file (see the module docstring)."""
    data = _load_json(path)
    if not isinstance(data, list):
        raise SourceError(f"{path}: expected a JSON list of HotpotQA records, got {type(data).__name__}")
    own_docs: list[list[str]] = []
    for i, rec in enumerate(data):
        where = f"{path}: record {i} (_id={rec.get('_id') if isinstance(rec, dict) else None!r})"
        if not isinstance(rec, dict):
            raise SourceError(f"{where}: not an object")
        for key in ("question", "answer", "context"):
            if key not in rec:
                raise SourceError(f"{where}: missing field {key!r}")
        if not isinstance(rec["answer"], str) or not isinstance(rec["question"], str):
            raise SourceError(f"{where}: 'question' and 'answer' must be strings")
        docs = []
        for j, para in enumerate(rec["context"]):
            ok = isinstance(para, list | tuple) and len(para) == 2 and isinstance(para[0], str)
            if not ok or not isinstance(para[1], list) or not all(isinstance(s, str) for s in para[1]):
                raise SourceError(f"{where}: context[{j}] is not [title, [sentences]]")
            docs.append(hotpotqa_doc(para[0], para[1]))
        if not docs:
            raise SourceError(f"{where}: empty context")
        own_docs.append(docs)
    pool = sorted({d for docs in own_docs for d in docs})
    position = {d: k for k, d in enumerate(pool)}
    questions = [
        Question(
            index=i,
            question=rec["question"],
            answers=[rec["answer"]],
            doc_ids=[position[d] for d in docs],
            qid=str(rec.get("_id", "")),
        )
        for i, (rec, docs) in enumerate(zip(data, own_docs, strict=True))
    ]
    return QASource(Path(path), questions, pool)


def read_squad(path: str | Path) -> QASource:
    """Answerable questions and paragraph pool of a SQuAD v2 file."""
    data = _load_json(path)
    if not isinstance(data, dict) or not isinstance(data.get("data"), list):
        raise SourceError(f"{path}: expected {{'data': [articles]}} (SQuAD v2 format)")
    contexts = []
    for a, article in enumerate(data["data"]):
        paragraphs = article.get("paragraphs") if isinstance(article, dict) else None
        if not isinstance(paragraphs, list):
            raise SourceError(f"{path}: article {a}: missing 'paragraphs' list")
        for p, para in enumerate(paragraphs):
            if not isinstance(para, dict) or not isinstance(para.get("context"), str):
                raise SourceError(f"{path}: article {a} paragraph {p}: missing 'context' string")
            if not isinstance(para.get("qas"), list):
                raise SourceError(f"{path}: article {a} paragraph {p}: missing 'qas' list")
            contexts.append(para["context"])
    pool = sorted(set(contexts))
    position = {d: k for k, d in enumerate(pool)}
    questions: list[Question] = []
    for a, article in enumerate(data["data"]):
        article_docs = [position[p["context"]] for p in article["paragraphs"]]
        for p, para in enumerate(article["paragraphs"]):
            own = position[para["context"]]
            for q, qa in enumerate(para["qas"]):
                qid = qa.get("id") if isinstance(qa, dict) else None
                where = f"{path}: article {a} paragraph {p} question {q} (id={qid!r})"
                if not isinstance(qa, dict) or not isinstance(qa.get("question"), str):
                    raise SourceError(f"{where}: missing 'question' string")
                if qa.get("is_impossible", False):
                    continue
                answers = qa.get("answers")
                if not isinstance(answers, list) or not answers:
                    raise SourceError(f"{where}: answerable question without 'answers'")
                if not all(isinstance(x, dict) and isinstance(x.get("text"), str) for x in answers):
                    raise SourceError(f"{where}: every answer needs a 'text' string")
                questions.append(
                    Question(
                        index=len(questions),
                        question=qa["question"],
                        answers=[x["text"] for x in answers],
                        doc_ids=[own],
                        more_doc_ids=[d for d in article_docs if d != own],
                        qid=str(qa.get("id", "")),
                    )
                )
    return QASource(Path(path), questions, pool)


def read_essay(path: str | Path) -> str:
    """The essay haystack text of ``{"text": ...}``."""
    data = _load_json(path)
    if not isinstance(data, dict) or not isinstance(data.get("text"), str):
        raise SourceError(f"{path}: expected {{'text': string}} (the essay haystack format)")
    if len(data["text"].split()) < 100:
        raise SourceError(f"{path}: the essay text has fewer than 100 words")
    return data["text"]
