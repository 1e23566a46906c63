"""Variable tracking (RULER's ``vt``): follow a chain of assignments hidden in noise.

A chain is ``VAR A = 12345`` followed by ``VAR B = VAR A`` ... for ``num_hops`` hops; variables are five
random upper-case letters. Its statements go, in order, between repetitions of the noise sentence. The
answer is every variable of the first chain (they all hold the value).
"""

from __future__ import annotations

import string

from taskutils.memory_data.ruler.common import RulerSample, UnitTask
from taskutils.memory_data.ruler.haystack import NOISE

TEMPLATE = (
    "Memorize and track the chain(s) of variable assignment hidden in the following text. "
    "Question: Find all variables that are assigned the value {query} in the text above."
)
# Stored, never used by the evaluation; the original's spelling ("assgined") is kept.
ANSWER_PREFIX = (
    " Answer: According to the chain(s) of variable assignment in the text above, {num_v} variables are "
    "assgined the value {query}, they are: "
)


class VariableTrackingTask(UnitTask):
    tokens_to_generate = 30
    guess_tokens_per_unit = 22.0

    def __init__(self, name: str, length: int, seed: int, tokenizer, num_chains: int = 1, num_hops: int = 4):
        super().__init__(name, length, seed, tokenizer)
        self.num_chains, self.num_hops = num_chains, num_hops
        self.min_units = num_chains * (num_hops + 1)

    def _chains(self, index: int) -> tuple[list[list[str]], list[list[str]]]:
        rng = self.rng(index)
        size = self.num_chains * (self.num_hops + 1)
        names: list[str] = []
        while len(names) < size:
            name = "".join(rng.choices(string.ascii_uppercase, k=5))
            if name not in names:
                names.append(name)
        variables, chains = [], []
        for c in range(self.num_chains):
            chain_vars = names[c * (self.num_hops + 1) : (c + 1) * (self.num_hops + 1)]
            statements = [f"VAR {chain_vars[0]} = {rng.randint(10000, 99999)}"]
            statements += [f"VAR {chain_vars[j + 1]} = VAR {chain_vars[j]} " for j in range(self.num_hops)]
            variables.append(chain_vars)
            chains.append(statements)
        return variables, chains

    def build(self, index: int, n: int) -> RulerSample:
        variables, chains = self._chains(index)
        sentences = [NOISE + "\n"] * n
        positions_rng = self.rng(index, "positions", n)
        for chain in chains:
            # Sorted positions, shifted by the statements already inserted, keep the chain in order.
            positions = sorted(positions_rng.sample(range(len(sentences)), len(chain)))
            for j, (position, statement) in enumerate(zip(positions, chain, strict=True)):
                sentences.insert(position + j, statement)
        context = " ".join(sentences).replace(". \n", ".\n")
        value = chains[0][0].split("=")[-1].strip()
        return RulerSample(
            input=TEMPLATE.format(query=value),
            context=context,
            outputs=variables[0],
            answer_prefix=ANSWER_PREFIX.format(num_v=self.num_hops + 1, query=value),
        )
