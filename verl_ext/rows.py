"""The token ids of a training run's rows: ``python -m verl_ext.rows DUMP_OR_DIR [--step N] [--tokenizer
MODEL]``.

A run's rollout dump (``trainer.rollout_data_dir``, one ``{step}.jsonl`` per step, a line per row) holds verl's
text columns (``input``, ``output``: decoded without special tokens) and ours (verl_ext/trainer.py
``DUMP_COLUMNS``); with ``recurrent.dump_token_ids`` (on in every CPU run: configs/cpu_platform.yaml) also each
row's ``prompt_ids`` and ``response_ids``, exactly as the row was trained. This prints them per row, in trajectory
and turn order, with their text: decoded from the ids themselves with ``--tokenizer`` (special tokens and chat
template included), else verl's text columns. ``--json`` writes one JSON object per row instead.

Exit status: 0; 2 when the dump cannot be read or holds no ids (a run without ``recurrent.dump_token_ids=true``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ID_COLUMNS = ("prompt_ids", "response_ids")


class RowsError(ValueError):
    """A dump that cannot be shown; the message names the file."""


def dump_file(path: Path, step: int | None = None) -> Path:
    """The dump to read: ``path`` itself, or in a dump folder the file of ``step`` (default: the last step)."""
    if path.is_file():
        return path
    if not path.is_dir():
        raise RowsError(f"{path}: no such dump file or folder")
    steps = sorted(int(p.stem) for p in path.glob("*.jsonl") if p.stem.isdigit())
    if not steps:
        raise RowsError(f"{path}: no {{step}}.jsonl dump in this folder (trainer.rollout_data_dir writes them)")
    if step is None:
        return path / f"{steps[-1]}.jsonl"
    if step not in steps:
        raise RowsError(f"{path}: no dump of step {step}; steps: {', '.join(map(str, steps))}")
    return path / f"{step}.jsonl"


def read_rows(path: Path, padding: bool = False) -> list[dict[str, Any]]:
    """The rows of one dump, by trajectory and turn (verl's padding rows left out unless ``padding``); every row
    must hold its ids."""
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise RowsError(f"{path}:{number}: not valid JSON ({err.msg})") from None
        missing = [column for column in ID_COLUMNS if not isinstance(row.get(column), list)]
        if missing:
            raise RowsError(
                f"{path}:{number}: the row has no {' or '.join(missing)}: the run wrote text only; run with "
                "recurrent.dump_token_ids=true (configs/cpu_platform.yaml sets it) to dump the ids"
            )
        if padding or not row.get("is_padding", False):
            rows.append(row)
    return sorted(rows, key=lambda r: (str(r.get("trajectory", r.get("uid", ""))), r.get("turn_index") or 0))


def row_record(row: dict[str, Any], tokenizer: Any = None) -> dict[str, Any]:
    """What is shown of a row: its key, place and ids, and the text of its prompt and response (decoded from the
    ids with ``tokenizer``, special tokens kept; else verl's text columns)."""
    record = {
        "uid": row.get("uid"),
        "trajectory": row.get("trajectory"),
        "turn_index": row.get("turn_index"),
        "turn_kind": row.get("turn_kind"),
        "score": row.get("score"),
        "advantage": row.get("advantage"),
        "temperature": row.get("temperature"),  # what sampled it (dumps before per-call sampling: None)
        "top_p": row.get("top_p"),
        "request": row.get("request"),  # the openai-client request it answered, and its choice (None: neither)
        "choice": row.get("choice"),
        "prompt_ids": row["prompt_ids"],
        "response_ids": row["response_ids"],
    }
    if tokenizer is not None:
        record["prompt_text"] = tokenizer.decode(row["prompt_ids"], skip_special_tokens=False)
        record["response_text"] = tokenizer.decode(row["response_ids"], skip_special_tokens=False)
    else:
        record["prompt_text"], record["response_text"] = row.get("input"), row.get("output")
    return record


def show(record: dict[str, Any], decoded: bool) -> str:
    """A row as text: a header line, then its ids and text."""
    source = "decoded from the ids" if decoded else "verl's text column, special tokens skipped"
    header = (
        f"== row {record['uid']} (trajectory {record['trajectory']}, turn {record['turn_index']}: "
        f"{record['turn_kind']}; score {record['score']}, advantage {record['advantage']}, "
        f"temperature {record['temperature']}, top_p {record['top_p']}{made_by(record)})"
    )
    return "\n".join(
        [
            header,
            f"prompt ids ({len(record['prompt_ids'])}): {record['prompt_ids']}",
            f"response ids ({len(record['response_ids'])}): {record['response_ids']}",
            f"prompt text ({source}):\n{record['prompt_text']}",
            f"response text ({source}):\n{record['response_text']}",
        ]
    )


def made_by(record: dict[str, Any]) -> str:
    """``; request R choice C`` for a row of an openai-client request, else nothing."""
    if record.get("request") is None:
        return ""
    return f"; request {record['request']} choice {record['choice']}"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m verl_ext.rows",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("dump", type=Path, help="a rollout dump ({step}.jsonl) or the folder holding them")
    parser.add_argument("--step", type=int, help="with a folder: the step to show (default: the last one)")
    parser.add_argument("--tokenizer", help="decode the ids with this model's tokenizer (a folder or an offline name)")
    parser.add_argument("--trajectory", help="only the rows of this trajectory ({uid}_{session})")
    parser.add_argument("--padding", action="store_true", help="also verl's padding rows")
    parser.add_argument("--json", action="store_true", help="one JSON object per row")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        path = dump_file(args.dump, args.step)
        rows = read_rows(path, args.padding)
    except (RowsError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.trajectory:
        rows = [row for row in rows if row.get("trajectory") == args.trajectory]
    tokenizer = None
    if args.tokenizer:
        from recurrent.models import load_tokenizer

        tokenizer = load_tokenizer(args.tokenizer)
    for row in rows:
        record = row_record(row, tokenizer)
        print(json.dumps(record, ensure_ascii=False) if args.json else show(record, tokenizer is not None) + "\n")
    if not args.json:
        print(f"{len(rows)} row(s) of {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
