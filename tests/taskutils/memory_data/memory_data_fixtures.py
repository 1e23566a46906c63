"""Small source files in the exact formats of HotpotQA, SQuAD v2 and the essay haystack, made here."""

from __future__ import annotations

import json
import random
from pathlib import Path

_WORDS = (
    "the of and to in is was for on with as by at from that this it be are which or an has had not but river city "
    "year born film team album band village county station school church bridge island mountain company novel "
    "writer player season league museum garden market harbor castle valley forest railway festival painter"
).split()
_NAMES = ["Alder", "Brook", "Cedar", "Dunmore", "Elston", "Fairview", "Glen", "Harrow", "Ivel", "Juniper", "Kestrel"]


def _sentence(rng: random.Random, words: int = 12) -> str:
    body = " ".join(rng.choice(_WORDS) for _ in range(words))
    return body[0].upper() + body[1:] + "."


def hotpotqa_records(num_questions: int, seed: int = 0, shared: int = 3) -> list[dict]:
    """HotpotQA-format records: 10 paragraphs each (2 gold with the answer), a few shared across questions."""
    rng = random.Random(seed)
    common = [[f"Common {k}", [" " + _sentence(rng) for _ in range(3)]] for k in range(shared)]
    records = []
    for q in range(num_questions):
        answer = f"{rng.choice(_NAMES)} {q}"
        gold = [
            [f"Gold {q}a", [f"Gold {q}a is in {answer}.", " " + _sentence(rng)]],
            [f"Gold {q}b", [_sentence(rng), f" It was founded by {answer} long ago."]],
        ]
        distractors = [[f"Distractor {q}-{k}", [_sentence(rng), " " + _sentence(rng)]] for k in range(7)]
        context = gold + distractors + [common[q % shared]]
        rng.shuffle(context)
        records.append(
            {
                "_id": f"5a{q:06x}",
                "question": f"Which place is linked to Gold {q}a and Gold {q}b?",
                "answer": answer,
                "supporting_facts": [[f"Gold {q}a", 0], [f"Gold {q}b", 1]],
                "context": context,
                "type": "bridge",
                "level": rng.choice(["easy", "medium", "hard"]),
            }
        )
    return records


def squad_data(articles: int = 4, paragraphs: int = 5, seed: int = 0) -> dict:
    """SQuAD v2-format data, with unanswerable questions mixed in."""
    rng = random.Random(seed)
    data = []
    for a in range(articles):
        paras = []
        for p in range(paragraphs):
            answer = f"{rng.choice(_NAMES)}-{a}-{p}"
            context = f"{_sentence(rng)} The keeper of article {a} part {p} is {answer}. {_sentence(rng, 20)}"
            qas = [
                {
                    "question": f"Who keeps article {a} part {p}?",
                    "id": f"q{a}{p}",
                    "answers": [{"text": answer, "answer_start": context.index(answer)}],
                    "is_impossible": False,
                },
                {"question": f"Who sold article {a} part {p}?", "id": f"x{a}{p}", "answers": [], "is_impossible": True},
            ]
            paras.append({"context": context, "qas": qas})
        data.append({"title": f"Article_{a}", "paragraphs": paras})
    return {"version": "v2.0", "data": data}


def essay_text(words: int = 6000, seed: int = 0) -> str:
    """Essay-like prose with abbreviations (Punkt must not split "Mr. Smith") and paragraph breaks."""
    rng = random.Random(seed)
    out, count = [], 0
    while count < words:
        sentence = _sentence(rng, rng.randint(6, 20))
        if rng.random() < 0.1:
            sentence = f"Mr. {rng.choice(_NAMES)} said: " + sentence
        out.append(sentence)
        count += len(sentence.split())
        if rng.random() < 0.08:
            out.append("\n\n")
    return " ".join(out)


def write_sources(folder: Path, hotpot_dev: int = 40, hotpot_train: int = 60) -> dict[str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = {
        "hotpotqa_dev": folder / "hotpotqa_dev.json",
        "hotpotqa_train": folder / "hotpotqa_train.json",
        "squad": folder / "squad.json",
        "essay": folder / "PaulGrahamEssays.json",
    }
    paths["hotpotqa_dev"].write_text(json.dumps(hotpotqa_records(hotpot_dev, seed=1)))
    paths["hotpotqa_train"].write_text(json.dumps(hotpotqa_records(hotpot_train, seed=2)))
    paths["squad"].write_text(json.dumps(squad_data()))
    paths["essay"].write_text(json.dumps({"text": essay_text()}))
    return paths
