"""Small generated eval sets in the formats of taskutils.memory_data (the tests never depend on the generators):
HotpotQA-style ``eval_{N}.jsonl`` (N documents, one holding the answer) and RULER-style
``eval_{task}_{L}.jsonl`` (a needle in a haystack of filler sentences)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import yaml

WORDS = (
    "river stone garden window lantern harbor meadow violet copper orchard village bridge market candle "
    "forest winter morning silver thunder valley castle pepper marble island anchor ribbon saddle quiet "
    "gentle bright ancient narrow hollow golden distant sudden careful"
).split()


def sentence(rng: random.Random) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(6, 12))]
    return " ".join(words).capitalize() + "."


def paragraph(rng: random.Random, sentences: int) -> str:
    return " ".join(sentence(rng) for _ in range(sentences))


def hotpotqa_set(folder: Path, num_docs: int, items: int = 4, seed: int = 0) -> Path:
    """``eval_{num_docs}.jsonl``: question "What is the secret code of NAME?", gold a number in one document."""
    rng = random.Random(seed * 1000 + num_docs)
    path = folder / f"eval_{num_docs}.jsonl"
    with path.open("w") as f:
        for index in range(items):
            name, code = f"Keeper{index}", str(rng.randint(1000, 9999))
            docs = [paragraph(rng, 3) for _ in range(num_docs)]
            where = rng.randrange(num_docs)
            docs[where] += f" The secret code of {name} is {code}."
            context = "\n\n".join(f"Document {i + 1}:\n{d}" for i, d in enumerate(docs))
            record = {
                "index": 10 + index,  # not 0..n-1: results are keyed by the item's own index
                "input": f"What is the secret code of {name}?",
                "context": context,
                "answers": [code],
                "num_docs": num_docs,
            }
            f.write(json.dumps(record) + "\n")
    return path


def niah_set(folder: Path, length: int, items: int = 4, seed: int = 0, task: str = "niah_single_1") -> Path:
    """``eval_{task}_{length}.jsonl``: ~``length // 40`` filler sentences with one magic number in the middle."""
    rng = random.Random(seed * 1000 + length)
    path = folder / f"eval_{task}_{length}.jsonl"
    with path.open("w") as f:
        for index in range(items):
            key, value = rng.choice(WORDS), str(rng.randint(1_000_000, 9_999_999))
            filler = [sentence(rng) for _ in range(max(2, length // 40))]
            filler.insert(len(filler) // 2, f"One of the special magic numbers for {key} is: {value}.")
            record = {
                "index": index,
                "input": f"What is the special magic number for {key} mentioned in the provided text?",
                "context": " ".join(filler),
                "outputs": [value],
                "length": length,
            }
            f.write(json.dumps(record) + "\n")
    return path


def read_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def harness_argv(data: Path, results: Path, length: int, *options: str) -> list[str]:
    """The harness command line the tests run: HotpotQA at one length, from ``data`` into ``results``, quiet and
    without the final report, plus ``options`` (the model, the server, retries...)."""
    paths = ("--data-dir", str(data), "--results-dir", str(results))
    return ["--tasks", "hotpotqa", "--lengths", str(length), *paths, "--no-report", "--quiet", *options]


TINY_BUDGETS = {
    "memory": {"chunk_size": 128, "max_new": 16, "final_max_new": 16},
    "direct": {"max_input": 400, "max_output": 16},
}


def write_table(path: Path, server, broken: bool = False) -> Path:
    """A model table of the tiny model behind ``server`` (its budgets small); ``broken``: and a model whose every
    request fails (the same server under a path it does not serve: HTTP 404)."""
    models = [
        {
            "name": "tiny",
            "checkpoint": "tiny",
            "url": server.base_url,
            "served_name": server.model,
            "concurrency": 1,
            **TINY_BUDGETS,
        }
    ]
    if broken:  # the same server under a path it does not serve: HTTP 404 for every request
        models.append(
            {
                "name": "broken",
                "checkpoint": "tiny",
                "url": server.base_url + "/no-such-path",
                "concurrency": 1,
                **TINY_BUDGETS,
            }
        )
    path.write_text(yaml.safe_dump({"models": models}))
    return path


# An agent of the user's own, outside the repository: it asks, runs the calculator the scripted model calls for
# (the arithmetic of the toy task only), hands back the result, and returns the model's last reply.
VERIFY_AGENT = """
import json
import re
from dataclasses import dataclass

from recurrent.functions import agent_function
from recurrent.interface import WorkflowConfig


@dataclass
class VerifyConfig(WorkflowConfig):
    max_tokens: int = 32


async def verify(sample, client, config):
    messages = [{"role": "user", "content": sample["input"]}]
    reply = await client.chat(messages, config.max_tokens)
    call = re.search(r"<tool_call>(.*)</tool_call>", reply.text)
    if call:
        a, op, b = json.loads(call.group(1))["arguments"]["expression"].split()
        result = {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op]
        messages += [{"role": "assistant", "content": reply.text},
                     {"role": "user", "content": f"<tool_response>{result}</tool_response>"}]
        reply = await client.chat(messages, config.max_tokens)
    return reply.text


REGISTER = agent_function("verify", VerifyConfig, verify, columns=("input",))
"""
