"""The token ids of a run's rows: the trainer's dump columns hold them with recurrent.dump_token_ids
(verl_ext/trainer.py dump_columns), and ``python -m verl_ext.rows`` prints them per row with
their text."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from recurrent.models import load_tokenizer
from verl_ext.rows import main as rows_main
from verl_ext.settings import recurrent_settings
from verl_ext.trainer import dump_columns


def jagged(rows: list[list[float]], dtype: torch.dtype) -> torch.Tensor:
    return torch.nested.nested_tensor([torch.tensor(r, dtype=dtype) for r in rows], layout=torch.jagged)


def test_the_dump_columns_hold_each_rows_ids_as_trained():
    keys = ["u_0_0", "u_0_1"]
    rows = {
        "advantages": jagged([[0.5, 0.5], [0.5, 0.5, 0.5]], torch.float32),
        "response_mask": jagged([[1, 1], [1, 1, 1]], torch.int64),
        "extra_fields": [
            {"turn_kind": "call", "temperature": 1.2, "request": "chatcmpl-recorded-0", "choice": 1},
            {"turn_kind": "final"},
        ],
        "prompts": jagged([[1, 2, 3], [1, 2, 3, 4, 5]], torch.int64),
        "responses": jagged([[7, 8], [9, 10, 11]], torch.int64),
    }
    columns = dump_columns(keys, [{}, {}], rows, token_ids=True, run_sampling={"temperature": 1.0, "top_p": 0.9})
    # a row's sampling: its call's own, else the run's
    assert columns["temperature"] == {"u_0_0": 1.2, "u_0_1": 1.0} and columns["top_p"] == {"u_0_0": 0.9, "u_0_1": 0.9}
    assert columns["request"] == {"u_0_0": "chatcmpl-recorded-0", "u_0_1": None}
    assert columns["choice"] == {"u_0_0": 1, "u_0_1": None}
    assert columns["prompt_ids"] == {"u_0_0": [1, 2, 3], "u_0_1": [1, 2, 3, 4, 5]}
    assert columns["response_ids"] == {"u_0_0": [7, 8], "u_0_1": [9, 10, 11]}
    assert "prompt_ids" not in dump_columns(keys, [{}, {}], rows)  # off: text only, as verl dumps
    assert recurrent_settings({"recurrent": {"dump_token_ids": True}}).dump_token_ids


def write_dump(folder: Path, tokenizer, with_ids: bool = True) -> list[dict]:
    rows = []
    for index, (prompt, response, kind) in enumerate(
        [("What is 6 times 7?", " 42", "call"), ("Box it.", " 42", "final")]
    ):
        row = {"input": prompt, "output": response, "gts": "42", "score": 1.0, "step": 3, "uid": f"p_0_{index}"}
        row |= {"trajectory": "p_0", "turn_index": index, "turn_kind": kind, "is_padding": False, "advantage": 0.5}
        row |= {"temperature": 1.0, "top_p": 0.9}
        row |= {"request": "chatcmpl-recorded-0", "choice": index} if kind == "call" else {}
        if with_ids:
            row |= {"prompt_ids": tokenizer.encode(prompt), "response_ids": tokenizer.encode(response)}
        rows.append(row)
    padding = {**rows[0], "uid": "p_0_9", "turn_index": 9, "is_padding": True}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "3.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [rows[1], padding, rows[0]]))
    (folder / "1.jsonl").write_text("")
    return rows


def test_the_rows_tool_prints_each_rows_ids_and_their_text(tmp_path, tiny_model_dir, capsys):
    tokenizer = load_tokenizer(tiny_model_dir)
    rows = write_dump(tmp_path / "rollout", tokenizer)
    assert rows_main([str(tmp_path / "rollout"), "--tokenizer", tiny_model_dir, "--json"]) == 0  # the last step
    shown = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["uid"] for r in shown] == ["p_0_0", "p_0_1"]  # turn order, padding left out
    for row, record in zip(rows, shown, strict=True):
        assert record["prompt_ids"] == row["prompt_ids"] and record["response_ids"] == row["response_ids"]
        assert record["prompt_text"] == tokenizer.decode(row["prompt_ids"], skip_special_tokens=False)
    assert rows_main([str(tmp_path / "rollout" / "3.jsonl")]) == 0  # a file; text as verl dumped it
    out = capsys.readouterr().out
    assert f"prompt ids ({len(rows[0]['prompt_ids'])}): {rows[0]['prompt_ids']}" in out
    assert "== row p_0_1 (trajectory p_0, turn 1: final; score 1.0, advantage 0.5, temperature 1.0, top_p 0.9)" in out
    assert (
        "turn 0: call; score 1.0, advantage 0.5, temperature 1.0, top_p 0.9; request chatcmpl-recorded-0 choice 0)"
        in out
    )
    assert "What is 6 times 7?" in out


def test_a_dump_without_ids_is_refused_with_the_switch_named(tmp_path, tiny_model_dir, capsys):
    write_dump(tmp_path / "rollout", load_tokenizer(tiny_model_dir), with_ids=False)
    assert rows_main([str(tmp_path / "rollout"), "--step", "3"]) == 2
    assert "recurrent.dump_token_ids=true" in capsys.readouterr().err
    assert rows_main([str(tmp_path / "rollout"), "--step", "2"]) == 2
    assert "no dump of step 2; steps: 1, 3" in capsys.readouterr().err
