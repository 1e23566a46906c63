"""Needle survival from hand-made traces: kept, dropped, miscopied, replaced, never written, needle in the last
chunk; the curve, the keep rate and the counts worked out by hand."""

import json
from pathlib import Path

import pytest

from experiments.needle.survival import (
    by_prior,
    collect,
    curves,
    main,
    memory_kind,
    read_events,
    write,
    write_events,
)

N = "The special magic number for brave-otter is 1234."
F = "The baker found a tall tree."


@pytest.mark.parametrize(
    ("memory", "kind"),
    [
        (N, "intact"),
        ("1234", "intact"),
        (F, "dropped"),
        ("The special magic number for brave-otter is 9Bat.", "dropped"),  # a lone digit is no number
        ("The special magic number for brave-otter is 1243.", "miscopied"),  # near copy (1-2-3 or 1-2-4 in order)
        ("The special magic number for brave-otter is 1284.", "miscopied"),  # one digit off
        (N.replace("1234", "123"), "miscopied"),  # a digit dropped
        ("The special magic number for brave-otter is 7777.", "replaced"),
        ("", "dropped"),
    ],
)
def test_memory_kind(memory, kind):
    assert memory_kind(memory, "1234") == kind


def test_a_longer_run_of_digits_is_not_the_number():
    assert memory_kind("is 12345.", "1234") == "miscopied"  # a digit added: not exact, a near copy


def write_results(root: Path, length: int, model: str, docs: list[tuple[int, list[str], int]], method="memory-boxed"):
    """docs: (needle chunk, memories, strict) per item; the eval set beside the results."""
    folder = root / "results" / f"needle_{length}"
    folder.mkdir(parents=True, exist_ok=True)
    lines = [
        {"id": i, "gold": ["1234"], "strict": s, "memories": memories, "pred": "1234" if s else "0"}
        for i, (_, memories, s) in enumerate(docs)
    ]
    (folder / f"{model}__{method}.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    data = root / "data"
    data.mkdir(exist_ok=True)
    items = [
        {"index": i, "input": "q", "context": "c", "answers": ["1234"], "needle_chunk": c}
        for i, (c, _, _) in enumerate(docs)
    ]
    (data / f"eval_needle_{length}.jsonl").write_text("".join(json.dumps(item) + "\n" for item in items))


def hand_made(root: Path) -> None:
    write_results(
        root,
        4,
        "rl-seed0",
        [
            (0, [N, N, N, N], 1),  # A kept: written at 0, 3 decisions, none lost
            (1, [F, N, F, F], 0),  # B dropped at 2: 1 decision (lost at k = 1)
            (0, [N, N, N.replace("1234", "1243"), N.replace("1234", "1243")], 0),  # C miscopied at 2 (k = 2)
            (3, [F, F, F, N], 1),  # D needle in the last chunk: written at 3, 0 decisions
            (2, [F, F, N.replace("1234", "1235"), F], 0),  # E never written (miscopied on its chunk)
        ],
    )
    write_results(root, 2, "rl-seed1", [(0, [N, N.replace("1234", "7777")], 0)])  # F replaced at 1 (k = 1)
    write_results(root, 2, "rl-seed1", [(0, [F, F], 0)], method="direct-boxed")  # another method: not read


def test_the_curve_by_hand(tmp_path):
    hand_made(tmp_path)
    events = collect(tmp_path / "results", tmp_path / "data")
    assert len(events) == 6
    table = curves(events)
    assert list(table) == ["RL"]  # both seeds are one policy
    rl = table["RL"]
    assert (rl.documents, rl.written) == (6, 5)
    assert rl.write_misses == {"dropped": 0, "miscopied": 1, "replaced": 0}
    assert rl.losses == {"dropped": 1, "miscopied": 1, "replaced": 1}
    # decisions: A 3, B 1, C 2, D 0, F 1
    assert rl.decisions == 7
    assert rl.keep_rate == pytest.approx(4 / 7)
    # k = 1: A, B, C, F at risk, B and F lost; k = 2: A, C at risk, C lost; k = 3: A alone, kept
    assert rl.at_risk[1:] == [4, 2, 1]
    assert rl.lost_at[1:] == [2, 1, 0]
    assert rl.survival == pytest.approx([1.0, 0.5, 0.25, 0.25])
    by_id = {(e.length, e.id): e for e in events}
    assert (by_id[(4, "3")].written, by_id[(4, "3")].decisions, by_id[(4, "3")].final_intact) == (3, 0, True)
    assert (by_id[(4, "4")].written, by_id[(4, "4")].write) == (None, "miscopied")
    assert (by_id[(4, "1")].lost, by_id[(4, "1")].loss, by_id[(4, "1")].final_intact) == (2, "dropped", False)


def test_the_files_and_the_cli(tmp_path, capsys):
    hand_made(tmp_path)
    assert main([str(tmp_path / "results"), "--data-dir", str(tmp_path / "data"), "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    # written 5/6 = 83.3 %; keep rate 4/7 = 57.14 %; S(1) 50, S(3) 25, no S(7) and beyond
    assert "| RL | 6 | 83.3 | 0 / 1 / 0 | 7 | 1 / 1 / 1 | 57.14 | 50.0 | 25.0 | – | – | – | – |" in out
    # by length: 2 chunks (F): written, lost, wrong; 4 chunks (A-E): written A-D, intact at the end A and D, right A, D
    assert "| policy | 2 chunks: written / kept / right | 4 chunks: written / kept / right |" in out
    assert "| RL | 100 / 0 / 0 | 80 / 40 / 40 |" in out
    events = read_events(tmp_path / "out" / "survival_events.csv")
    assert events == collect(tmp_path / "results", tmp_path / "data")
    lines = (tmp_path / "out" / "survival.csv").read_text().splitlines()
    assert lines[0] == "policy,k,at_risk,lost,survival,fitted"
    assert lines[2] == f"RL,1,4,2,0.5,{round(4 / 7, 4)}"
    assert (tmp_path / "out" / "survival.png").stat().st_size > 1000


def test_the_write_by_what_the_memory_held_before_the_needle(tmp_path):
    """Each document's memory when the needle's chunk came, and the table of writes and answers by it, by hand."""
    made_up = "The special magic number for brave-otter is 9945."
    write_results(
        tmp_path,
        3,
        "rl-seed0",
        [
            (0, [N, N, N], 1),  # G: the needle in the first chunk
            (1, [F, N, N], 1),  # H: filler before it, written, right
            (1, ["The special magic number for brave-otter is 45.", N, N], 1),  # I: two digits before it
            (2, [made_up, made_up, made_up.replace("9945", "1245")], 0),  # J: a made-up needle, blended, wrong
            (1, [made_up, N, N], 1),  # K: a made-up needle, overwritten, right
        ],
    )
    events = collect(tmp_path / "results", tmp_path / "data")
    assert [e.before for e in events] == ["first chunk", "no number", "part of a number"] + ["a whole number"] * 2
    assert events[3].write == "miscopied"  # 1245: 1-2-4 of 1234 in order, a near copy
    # first chunk 1 (written, right); no number 1 (written, right); part 1 (written, right); whole 2: K written and
    # right, J neither: 50 / 50
    assert by_prior(events).splitlines()[2] == "| RL | 1: 100 / 100 | 1: 100 / 100 | 1: 100 / 100 | 2: 50 / 50 |"
    assert main([str(tmp_path / "results"), "--data-dir", str(tmp_path / "data"), "--out", str(tmp_path / "out")]) == 0
    assert by_prior(events) in (tmp_path / "out" / "survival.md").read_text()
    assert read_events(tmp_path / "out" / "survival_events.csv") == events


def test_events_round_trip(tmp_path):
    hand_made(tmp_path)
    events = collect(tmp_path / "results", tmp_path / "data")
    write_events(events, tmp_path / "events.csv")
    assert read_events(tmp_path / "events.csv") == events


def test_untraced_results_and_missing_eval_sets_are_errors(tmp_path, capsys):
    hand_made(tmp_path)
    assert main([str(tmp_path / "results"), "--data-dir", str(tmp_path / "nowhere")]) == 2
    assert "eval_needle_2.jsonl: no eval set" in capsys.readouterr().err
    path = tmp_path / "results" / "needle_2" / "rl-seed1__memory-boxed.jsonl"
    path.write_text(json.dumps({"id": 0, "gold": ["1234"], "strict": 0}) + "\n")
    assert main([str(tmp_path / "results"), "--data-dir", str(tmp_path / "data")]) == 2
    assert "run the harness with --trace" in capsys.readouterr().err
    assert main([str(tmp_path / "empty"), "--data-dir", str(tmp_path / "data")]) == 2


def test_write_returns_the_four_files(tmp_path):
    hand_made(tmp_path)
    paths = write(tmp_path / "results", tmp_path / "data")
    assert sorted(paths) == ["csv", "events", "md", "png"]
    assert all(p.parent == tmp_path / "results" for p in paths.values())


def test_the_warm_starts_evaluation_counts_keep_decisions_as_the_survival_table_does():
    from types import SimpleNamespace

    from experiments.needle.warm_start.evaluation import keeping

    sessions = [
        SimpleNamespace(memory_trace=["filler", "is 1234.", "is 1234.", "filler"]),  # written at 1, lost at 3
        SimpleNamespace(memory_trace=["is 5678.", "is 5678."]),  # written at 0, kept to the end
        SimpleNamespace(memory_trace=["filler", "filler"]),  # never written
    ]
    docs = [
        {"value": "1234", "needle_chunk": 1},
        {"value": "5678", "needle_chunk": 0},
        {"value": "9", "needle_chunk": 1},
    ]
    # decisions: chunks 2 and 3 (the lost one counts) = 2; chunk 1 = 1; losses: 1
    assert keeping(sessions, docs) == {"written": 2, "keep_decisions": 3, "losses": 1}
