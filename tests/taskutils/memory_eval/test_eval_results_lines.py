"""A results file's sidecar and a failed item's line (taskutils/memory_eval/results.py, runner.py): a rerun after
its results file was deleted starts afresh with its new settings, whatever the sidecar left behind says; a failed
item's line holds its error and no response, even when its agent returned an answer before failing."""

from __future__ import annotations

import json

import pytest

from recurrent.functions import FunctionEpisode
from recurrent.interface import Reply, WorkflowConfig
from recurrent.trace import TraceWriter
from taskutils.memory_eval import results
from taskutils.memory_eval.runner import run_items


@pytest.mark.timeout(10)
def test_a_rerun_with_new_settings_after_its_results_file_was_deleted_starts_afresh(tmp_path):
    path = results.results_path(tmp_path, "niah_single_1", 256, "m", "memory")
    assert results.prepare(path, {"method": "memory", "chunk_size": 5}) == set()
    path.write_text(json.dumps({"id": 0, "error": None}) + "\n")
    with pytest.raises(results.SettingsMismatchError, match="chunk_size"):  # its results are still there
        results.prepare(path, {"method": "memory", "chunk_size": 6})
    path.unlink()  # the results deleted by hand, the sidecar left behind
    assert results.prepare(path, {"method": "memory", "chunk_size": 6}) == set()
    assert json.loads(results.meta_path(path).read_text())["settings"] == {"method": "memory", "chunk_size": 6}


class Numbered:
    """A chat client that answers ``reply N`` to its N-th call (from 1), 3 prompt and 2 completion tokens each."""

    def __init__(self) -> None:
        self.calls = 0

    async def chat(self, messages, max_tokens, **sampling) -> Reply:
        self.calls += 1
        return Reply(f"reply {self.calls}", "stop", prompt_tokens=3, completion_tokens=2)


async def draft_then_check(sample, client, config) -> str:
    """Two calls, and the first reply returned: an answer that is not its last call's reply, so the item fails
    after its agent has returned an answer."""
    draft = await client.chat([{"role": "user", "content": sample["input"]}], 8)
    await client.chat([{"role": "user", "content": draft.text}], 8)
    return draft.text


@pytest.mark.timeout(10)
async def test_a_failed_items_line_holds_its_error_and_no_response(tmp_path):
    item = {"index": 4, "input": "What is the number?", "answers": ["7"]}

    def record(item, session, error, seconds):
        return results.item_record(
            item=item,
            task="niah_single_1",
            length=256,
            model="m",
            method="mine",
            session=session,
            error=error,
            seconds=seconds,
            scores={"strict": 0.0},
            gold=["7"],
        )

    out = tmp_path / "m__mine.jsonl"
    with TraceWriter(out) as writer:
        outcome = await run_items(
            [item],
            lambda item: FunctionEpisode(draft_then_check, item, WorkflowConfig(), "mine"),
            record,
            Numbered(),
            writer,
            concurrency=1,
        )
    (line,) = [json.loads(text) for text in out.read_text().splitlines()]
    assert (outcome.done, outcome.failed) == (1, 1)
    assert line["error"].startswith("AnswerNotLastReplyError: the agent's answer is not its last call's reply")
    assert line["response"] is None  # not 'reply 1', the answer the agent returned before it failed
    assert (line["id"], line["turns"], line["prompt_tokens"], line["completion_tokens"]) == (4, 2, 6, 4)
