"""What every RULER task shares: the sample record, per-sample RNGs, random keys/values, and the
haystack-size calibration loop for tasks whose haystack is a count of units."""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass, field

from taskutils.memory_data.ruler.calibrate import fit_units, linear_probe
from taskutils.memory_data.ruler.haystack import word_list
from taskutils.memory_data.tokenizer import count_tokens

PROBE_INDEX = -1  # the sample index of the calibration probe (never written)


@dataclass
class RulerSample:
    input: str  # the question/instruction only: the memory agent reads the context separately
    context: str
    outputs: list[str]
    answer_prefix: str = ""
    extra: dict = field(default_factory=dict)  # task-specific fields written to the record


def rng_for(seed: int, task: str, length: int, index: int, *salt: object) -> random.Random:
    """The RNG of one sample (plus optional salt), derived from its identity only: any worker count, any
    resume point and any generation order give the same sample."""
    return random.Random("/".join(map(str, ("ruler", task, length, seed, index, *salt))))


def random_number(rng: random.Random, digits: int = 7) -> str:
    return str(rng.randint(10 ** (digits - 1), 10**digits - 1))


def random_uuid(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def random_word_key(rng: random.Random) -> str:
    """An adjective-noun pair, drawn as two independent indices: no 6M-entry product list is built."""
    adjectives, nouns = word_list("adjectives"), word_list("nouns")
    return f"{adjectives[rng.randrange(len(adjectives))]}-{nouns[rng.randrange(len(nouns))]}"


def random_value(rng: random.Random, kind: str) -> str:
    if kind == "numbers":
        return random_number(rng)
    if kind == "uuids":
        return random_uuid(rng)
    if kind == "words":
        return random_word_key(rng)
    raise ValueError(f"unknown needle type {kind!r}")


class UnitTask:
    """A task whose haystack is ``n`` units; subclasses implement :meth:`build` and set the class fields."""

    tokens_to_generate: int = 0
    guess_tokens_per_unit: float = 10.0  # only sizes the probe; the probe measures the real rate
    min_units: int = 1

    def __init__(self, name: str, length: int, seed: int, tokenizer) -> None:
        self.name, self.length, self.seed, self.tokenizer = name, length, seed, tokenizer
        self._line: tuple[float, float] | None = None

    def build(self, index: int, n: int) -> RulerSample:
        raise NotImplementedError

    def max_units(self) -> int | None:
        return None

    def rng(self, index: int, *salt: object) -> random.Random:
        return rng_for(self.seed, self.name, self.length, index, *salt)

    def count(self, sample: RulerSample) -> int:
        """Tokens the paper counts for a sample: input + context + tokens to generate."""
        return (
            count_tokens(sample.input, self.tokenizer)
            + count_tokens(sample.context, self.tokenizer)
            + (self.tokens_to_generate)
        )

    def _measured(self, index: int, n: int) -> tuple[RulerSample, int]:
        sample = self.build(index, n)
        return sample, self.count(sample)

    def line(self) -> tuple[float, float]:
        """tokens ~ a + b * n, measured once on the probe sample (same in every worker: deterministic)."""
        if self._line is None:
            probe_tokens = min(self.length, 8192) / 2
            n_a = max(self.min_units, int(probe_tokens / 2 / self.guess_tokens_per_unit))
            cap = self.max_units()
            if cap is not None:
                n_a = max(self.min_units, min(n_a, cap // 2))
            self._line = linear_probe(lambda n: self._measured(PROBE_INDEX, n)[1], n_a)
        return self._line

    def generate(self, index: int) -> tuple[RulerSample, int]:
        """The sample ``index`` calibrated to the target length, and its length in tokens."""
        intercept, slope = self.line()
        fit = fit_units(
            lambda n: self._measured(index, n),
            self.length,
            intercept,
            slope,
            n_min=self.min_units,
            n_max=self.max_units(),
        )
        return fit.sample, fit.tokens
