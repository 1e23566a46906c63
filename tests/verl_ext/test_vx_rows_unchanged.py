"""The memory agent's training rows did not change when the framework was made generic over agents.

``data/memory_rows.json`` holds the rows the memory agent's verl loop produced, before that change, for four
documents (0, 1, 5 and 8 chunks), two trajectories each, in async and in sync (lockstep) mode, under a scripted
token server whose replies are a pure function of the prompt ids (``scripted_server.py``). Given the same replies,
today's code must produce the same rows token for token: prompt ids, response ids, masks, log-probs, turn counts and
the extra fields verl stores.
"""

from __future__ import annotations

import json
from pathlib import Path

from capture_memory_rows import capture

FIXTURE = Path(__file__).parent / "data" / "memory_rows.json"


async def test_the_memory_agents_rows_are_unchanged_token_for_token():
    before = json.loads(FIXTURE.read_text())
    now = json.loads(json.dumps(await capture()))  # the same JSON round trip as the fixture
    assert now["documents"] == before["documents"] and now["budgets"] == before["budgets"]
    for mode in ("trajectories", "lockstep"):
        assert sorted(now[mode]) == sorted(before[mode])
        for name, rows in before[mode].items():
            assert now[mode][name] == rows, f"{mode} {name}: the rows differ"
    # The fixture covers what it claims: every trajectory ends with its answer and most have several calls.
    lengths = sorted({len(rows) for rows in before["trajectories"].values()})
    assert lengths == [1, 2, 6, 9]
    assert all(rows[-1]["extra_fields"]["turn_kind"] == "final" for rows in before["trajectories"].values())
