"""Question answering over many documents: ``qa_1`` (SQuAD v2 dev) and ``qa_2`` (HotpotQA dev).

Sample ``i`` asks question ``i`` of the file (answerable ones for SQuAD). Its documents are the question's
own (SQuAD: its paragraph; HotpotQA: its 10 paragraphs), then the same article's other paragraphs (SQuAD),
then random documents of the pool, shuffled and formatted ``"Document i:\\n{doc}"``. The documents are
chosen to fill the token budget: each candidate's tokens are counted once and a candidate that would
overflow is skipped, so samples land within a fraction of a percent of the target; one full count checks.
When a length needs more documents than the pool holds (SQuAD at 512K, which the original skipped), the
pool's distractors are drawn again in a fresh random order: documents repeat, the gold paragraph never does.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from taskutils.memory_data.ruler.calibrate import CalibrationError
from taskutils.memory_data.ruler.common import RulerSample, rng_for
from taskutils.memory_data.sources import QASource
from taskutils.memory_data.tokenizer import count_tokens

TEMPLATE = "Answer the question based on the given documents. {query}"
ANSWER_PREFIX = " Answer:"
DOCUMENT_PROMPT = "Document {i}:\n{document}"
SEPARATOR = "\n\n"
MAX_SKIPS = 200  # consecutive candidates too long for the remaining budget before the fill stops


class QATask:
    tokens_to_generate = 32

    def __init__(self, name: str, length: int, seed: int, tokenizer, source: QASource) -> None:
        self.name, self.length, self.seed, self.tokenizer, self.source = name, length, seed, tokenizer, source
        self._doc_tokens: dict[int, int] = {}
        self._label_tokens: dict[int, int] = {}
        self._separator = count_tokens(SEPARATOR, tokenizer)

    def doc_cost(self, doc: int, position: int) -> int:
        """Tokens a document adds at 1-based ``position``: its label, its text, and the separator before it."""
        if doc not in self._doc_tokens:
            self._doc_tokens[doc] = count_tokens(self.source.docs[doc], self.tokenizer)
        if position not in self._label_tokens:
            self._label_tokens[position] = count_tokens(DOCUMENT_PROMPT.format(i=position, document=""), self.tokenizer)
        return self._doc_tokens[doc] + self._label_tokens[position] + (self._separator if position > 1 else 0)

    def _distractors(self, index: int, exclude: set[int]) -> Iterator[int]:
        """Random pool documents outside ``exclude``; a new random order each time the pool is exhausted."""
        others = [d for d in range(len(self.source.docs)) if d not in exclude]
        cycle = 0
        while others:
            order = others[:]
            rng_for(self.seed, self.name, self.length, index, "distractors", cycle).shuffle(order)
            yield from order
            cycle += 1

    def count(self, sample: RulerSample) -> int:
        return (
            count_tokens(sample.input, self.tokenizer)
            + count_tokens(sample.context, self.tokenizer)
            + self.tokens_to_generate
        )

    def generate(self, index: int) -> tuple[RulerSample, int]:
        questions = self.source.questions
        if index >= len(questions):
            raise ValueError(f"{self.source.path} has {len(questions)} usable questions; sample {index} needs more")
        q = questions[index]
        rng = rng_for(self.seed, self.name, self.length, index)
        question = TEMPLATE.format(query=q.question)
        budget = self.length - count_tokens(question, self.tokenizer) - self.tokens_to_generate
        chosen = list(q.doc_ids)
        used = sum(self.doc_cost(d, k + 1) for k, d in enumerate(chosen))
        if used > budget:
            raise CalibrationError(f"{self.name} sample {index}: its own documents alone exceed {self.length} tokens")
        more = list(q.more_doc_ids)
        rng.shuffle(more)
        skips = 0
        for candidate in itertools.chain(more, self._distractors(index, set(q.doc_ids) | set(more))):
            cost = self.doc_cost(candidate, len(chosen) + 1)
            if used + cost <= budget:
                chosen.append(candidate)
                used += cost
                skips = 0
            else:
                skips += 1
                if skips >= MAX_SKIPS or budget - used < 0.002 * self.length:
                    break
        own = len(q.doc_ids)
        order = list(range(len(chosen)))
        rng.shuffle(order)
        while True:
            sample = self._render(question, q.answers, chosen, order)
            tokens = self.count(sample)
            if tokens <= self.length or len(order) == own:
                break
            # Seams between pieces can add a token or two: drop the last-added distractor and recount.
            last = max(order)
            order.remove(last)
        if tokens > self.length:
            raise CalibrationError(f"{self.name} sample {index}: {tokens} tokens exceed {self.length}")
        return sample, tokens

    def _render(self, question: str, answers: list[str], chosen: list[int], order: list[int]) -> RulerSample:
        docs = self.source.docs
        context = SEPARATOR.join(DOCUMENT_PROMPT.format(i=k + 1, document=docs[chosen[j]]) for k, j in enumerate(order))
        return RulerSample(input=question, context=context, outputs=list(answers), answer_prefix=ANSWER_PREFIX)
