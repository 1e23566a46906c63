"""The per-step memories of an RL run's rollout dumps (experiments/needle/rollout_memories.py), on hand-built rows
whose shares are counted by hand."""

import json

from experiments.needle.rollout_memories import main, run_table

QUESTION = "<problem> \nWhat is the special magic number for {key} mentioned in the provided text?\n</problem>"
A = "The special magic number for brave-otter is 4821."  # the asked needle
B = "The special magic number for brave-tiger is 7350."
C = "The special magic number for calm-falcon is 1296."
BLEND = "The special magic number for brave-otter is 7350."  # A's key, B's number


def memory_row(trajectory, turn, section, output, key="brave-otter"):
    prompt = f"{QUESTION.format(key=key)}\n\n<memory>\n...\n</memory>\n\n<section>\n{section}\n</section>\n"
    return {
        "trajectory": trajectory,
        "turn_index": str(turn),
        "turn_kind": "memory",
        "input": prompt,
        "output": output,
        "gts": "4821",
        "score": "0.0",
        "is_padding": "False",
    }


def final_row(trajectory, turn, score, key="brave-otter"):
    return {
        "trajectory": trajectory,
        "turn_index": str(turn),
        "turn_kind": "final",
        "input": f"{QUESTION.format(key=key)}\n\n<memory>\n...\n</memory>\n",
        "output": "\\boxed{4821}",
        "gts": "4821",
        "score": str(score),
        "is_padding": "False",
    }


def write_dump(folder, step, rows):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{step}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_each_steps_shares_are_counted_over_the_memories_that_name_a_needle(tmp_path):
    run = tmp_path / "run"
    # trajectory t1 (2 chunks, rows out of order): filler memory (names no needle), then B whole; last memory B
    # trajectory t2 (2 chunks): a blend (names a needle, not whole), then the bare number 4821 (whole, asked)
    # a padding row: left out
    t1 = [
        final_row("t1", 2, 0.0),
        memory_row("t1", 1, f"Filler. {B} More filler. {C}", B),
        memory_row("t1", 0, f"Filler. {A} Filler.", "The farmer walked to the red barn."),
    ]
    t2 = [
        memory_row("t2", 0, f"{A} {B}", BLEND),
        memory_row("t2", 1, "Filler only.", " 4821"),
        final_row("t2", 2, 1.0),
    ]
    pad = memory_row("p", 0, A, A) | {"is_padding": "True"}
    write_dump(run / "rollout", 1, t1 + t2 + [pad])
    # step 2: one trajectory whose memories are A then A: both whole and asked, the last one asked
    write_dump(
        run / "rollout",
        2,
        [memory_row("t3", 0, f"{A} {C}", A), memory_row("t3", 1, "Filler.", A + " "), final_row("t3", 2, 1.0)],
    )
    table = run_table(run)
    # step 1: needle memories B, BLEND, 4821 = 3; whole B, 4821 = 2; asked 4821 = 1; last memory asked: t2 only
    assert table[0] == {
        "step": 1,
        "trajectories": 2,
        "reward": 0.5,
        "needle_memories": 3,
        "whole": round(2 / 3, 4),
        "asked": round(1 / 3, 4),
        "final_asked": 0.5,
        # before the chunk showing 4821: t1's needle (A) is in its first chunk, none before; t2's too
        "turns_before": 0,
        "numbers_before": 0,
    }
    assert table[1] == {
        "step": 2,
        "trajectories": 1,
        "reward": 1.0,
        "needle_memories": 2,
        "whole": 1.0,
        "asked": 1.0,
        "final_asked": 1.0,
        "turns_before": 0,
        "numbers_before": 0,
    }
    assert main([str(run)]) == 0
    lines = (run / "memories.csv").read_text().splitlines()
    assert lines[0] == "step,trajectories,reward,needle_memories,whole,asked,final_asked,turns_before,numbers_before"
    assert lines[1] == "1,2,0.5,3,0.6667,0.3333,0.5,0,0" and len(lines) == 3
    assert (run / "memories.png").stat().st_size > 0


def test_a_folder_without_dumps_or_with_a_row_missing_its_answer_is_refused(tmp_path, capsys):
    assert main([str(tmp_path)]) == 2
    assert "no {step}.jsonl dump" in capsys.readouterr().err
    write_dump(tmp_path / "rollout", 3, [memory_row("t1", 0, A, A)])
    assert main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "3.jsonl" in err and "trajectory t1: 0 answer rows, expected 1" in err


def test_the_memories_before_the_needles_chunk_count_the_numbers_written_there(tmp_path):
    run = tmp_path / "run"
    # 4 chunks, the needle (A, number 4821) in the third: two turns before it, the second writes a made-up needle
    made_up = "The special magic number for brave-otter is 9999."
    rows = [
        memory_row("t", 0, "Filler one.", "Filler one."),
        memory_row("t", 1, f"Filler two. {B}", made_up),
        memory_row("t", 2, f"Filler three. {A}", A),
        memory_row("t", 3, "Filler four, 1234 apples.", A),
        final_row("t", 4, 1.0),
    ]
    write_dump(run / "rollout", 5, rows)
    (line,) = run_table(run)
    assert (line["turns_before"], line["numbers_before"]) == (2, 1)
    # a document whose needle is never shown (cut by a chunk edge): every turn is before it
    write_dump(run / "rollout", 5, [memory_row("u", 0, "Filler.", "7777"), final_row("u", 1, 0.0)])
    (line,) = run_table(run)
    assert (line["turns_before"], line["numbers_before"]) == (1, 1)
