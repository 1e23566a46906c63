"""Needle in a haystack: single, multi-key, multi-value and multi-query (RULER's ``niah``).

A needle reads "One of the special magic {values} for {key} is: {value}." Keys are adjective-noun words or
uuids, values 7-digit numbers or uuids. Haystacks: ``repeat`` (the noise sentence, one per line),
``essay`` (needles between essay sentences at depths drawn from 40 evenly spaced percentages) and
``needle`` (other needles, one per line, whose keys never equal a queried key). The answer is every value
of the queried keys. The input holds the question only (MemAgent's template has no context slot).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from taskutils.memory_data.ruler.common import RulerSample, UnitTask, random_value
from taskutils.memory_data.ruler.haystack import NOISE, Essay, insert_at_depths

NEEDLE = "One of the special magic {type_needle_v} for {key} is: {value}."
TEMPLATE = (
    "Some special magic {type_needle_v} are hidden within the following text. Make sure to memorize it. "
    "What are all the special magic {type_needle_v} for {query} mentioned in the provided text?"
)
ANSWER_PREFIX = " The special magic {type_needle_v} for {query} mentioned in the provided text are"
DEPTHS = [int(d) for d in np.round(np.linspace(0, 100, num=40, endpoint=True))]


@dataclass(frozen=True)
class NiahParams:
    haystack: str  # repeat | essay | needle
    key_type: str  # words | uuids | numbers
    value_type: str
    num_keys: int = 1
    num_values: int = 1
    num_queries: int = 1


def _singular(text: str) -> str:
    # The official wording change for one queried value (order matters: "are all" before "are").
    return text.replace("Some", "A").replace("are all", "is").replace("are", "is").replace("answers", "answer")


class NiahTask(UnitTask):
    tokens_to_generate = 128

    def __init__(self, name: str, length: int, seed: int, tokenizer, params: NiahParams, essay: str | None = None):
        super().__init__(name, length, seed, tokenizer)
        self.params = params
        self.num_keys = max(params.num_keys, params.num_queries)
        self.num_needles = self.num_keys * params.num_values
        self.min_units = self.num_needles if params.haystack != "essay" else 1
        if params.haystack == "essay":
            if essay is None:
                raise ValueError(f"{name} needs the essay haystack (--essay-file)")
            self.essay = Essay(essay)
            self.guess_tokens_per_unit = 1.4
        elif params.haystack == "repeat":
            self.guess_tokens_per_unit = 22.0
        elif params.haystack == "needle":
            self.guess_tokens_per_unit = 60.0 if "uuids" in (params.key_type, params.value_type) else 25.0
        else:
            raise ValueError(f"unknown haystack {params.haystack!r}")

    def _needles(self, index: int):
        """Keys, values, needles (shuffled), query keys and answers: independent of the haystack size."""
        p, rng = self.params, self.rng(index)
        keys: list[str] = []
        while len(keys) < self.num_keys:
            key = random_value(rng, p.key_type)
            if key not in keys:
                keys.append(key)
        values: list[list[str]] = []
        needles = []
        for key in keys:
            vals: list[str] = []
            while len(vals) < p.num_values:
                value = random_value(rng, p.value_type)
                if value not in vals:
                    vals.append(value)
            values.append(vals)
            needles += [NEEDLE.format(type_needle_v=p.value_type, key=key, value=v) for v in vals]
        rng.shuffle(needles)
        queried = rng.sample(range(self.num_keys), p.num_queries)
        return rng, keys, needles, [keys[i] for i in queried], [v for i in queried for v in values[i]]

    def build(self, index: int, n: int) -> RulerSample:
        p = self.params
        rng, keys, needles, queries, answers = self._needles(index)
        if p.haystack == "essay":
            depths = rng.sample(DEPTHS, len(needles))
            context = insert_at_depths(self.essay.prefix(n), depths, needles)
        else:
            if p.haystack == "repeat":
                lines = [NOISE] * n
            else:
                filler = self.rng(index, "haystack")  # prefix-consistent: n+1 fillers extend n fillers
                reserved = set(keys)
                lines = []
                while len(lines) < n:
                    key = random_value(filler, p.key_type)
                    if key not in reserved:
                        value = random_value(filler, p.value_type)
                        lines.append(NEEDLE.format(type_needle_v=p.value_type, key=key, value=value))
            positions = sorted(self.rng(index, "positions", n).sample(range(n), len(needles)), reverse=True)
            for position, needle in zip(positions, needles, strict=True):
                lines.insert(position, needle)
            context = "\n".join(lines)
        query = ", ".join(queries[:-1]) + ", and " + queries[-1] if len(queries) > 1 else queries[0]
        template, prefix, type_v = TEMPLATE, ANSWER_PREFIX, p.value_type
        if p.num_queries * p.num_values == 1:
            template, prefix, type_v = _singular(template), _singular(prefix), type_v[:-1]
        return RulerSample(
            input=template.format(type_needle_v=type_v, query=query),
            context=context,
            outputs=answers,
            answer_prefix=prefix.format(type_needle_v=type_v, query=query),
        )
