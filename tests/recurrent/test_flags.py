"""Command lines built from settings dataclasses (recurrent/flags.py): each field's flag, type, default and help come
from the field; the parsed flags give the dataclass back; a --config file's keys are the long flags."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import pytest

from recurrent.flags import ClientOptions, SamplingOptions, add_flags, flag, from_args
from recurrent.options import parse_with_config, positive_int, seconds


@dataclass(frozen=True)
class Toy:
    inputs: list[Path] = flag(help="files", type=Path, nargs="+", positional=True)
    chunk_size: int = flag(128, "tokens per chunk (default %(default)s)", type=positive_int)
    wait: float = flag(0.0, "seconds (0: none)", type=seconds)
    mode: str = flag("a", "a or b", choices=("a", "b"))
    names: list[str] = flag(help="several", factory=lambda: ["x", "y"], nargs="+")
    quiet: bool = flag(False, "say less")
    note: str | None = flag(None, lambda: "built " + "late")
    internal: int = 7  # no flag: not on the command line


def toy_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="toy")
    parser.add_argument("--config", type=Path)
    add_flags(parser, Toy, only=["inputs"])
    add_flags(parser.add_argument_group("the rest"), Toy, skip=["inputs"])
    return parser


def test_the_fields_flags_parse_into_the_dataclass():
    args = toy_parser().parse_args(["a.txt", "b.txt", "--chunk-size", "64", "--mode", "b", "--quiet"])
    assert from_args(Toy, args) == Toy(
        inputs=[Path("a.txt"), Path("b.txt")], chunk_size=64, wait=0.0, mode="b", names=["x", "y"], quiet=True
    )
    defaults = from_args(Toy, toy_parser().parse_args(["a.txt"]), internal=9)
    assert (defaults.chunk_size, defaults.quiet, defaults.note, defaults.internal) == (128, False, None, 9)
    assert not hasattr(toy_parser().parse_args(["a.txt"]), "internal")


def test_the_help_shows_each_fields_default_and_late_help():
    text = " ".join(toy_parser().format_help().split())
    assert "--chunk-size CHUNK_SIZE tokens per chunk (default 128)" in text
    assert "--quiet say less" in text and "--note NOTE built late" in text and "{a,b}" in text


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["a", "--chunk-size", "0"], "argument --chunk-size: must be a positive integer, got 0"),
        (["a", "--wait", "inf"], "argument --wait: must be a finite number of seconds >= 0, got inf"),
        (["a", "--wait", "nan"], "argument --wait: must be >= 0 seconds, got nan"),
        (["a", "--mode", "c"], "argument --mode: invalid choice: 'c'"),
        ([], "the following arguments are required: inputs"),
    ],
)
def test_a_bad_value_is_refused_by_its_flag(capsys, argv, said):
    with pytest.raises(SystemExit) as stop:
        toy_parser().parse_args(argv)
    assert stop.value.code == 2 and said in capsys.readouterr().err


def test_a_config_file_sets_the_fields_by_their_long_flags(tmp_path, capsys):
    config = tmp_path / "toy.yaml"
    config.write_text("chunk-size: 32\nmode: b\nquiet: true\n")
    args = parse_with_config(toy_parser(), ["a", "--config", str(config), "--chunk-size", "16"])
    assert (args.chunk_size, args.mode, args.quiet) == (16, "b", True)  # the command line wins
    config.write_text("wait: .inf\n")
    with pytest.raises(SystemExit):
        parse_with_config(toy_parser(), ["a", "--config", str(config)])
    assert f"{config}:1: option 'wait': must be a finite number of seconds >= 0, got inf" in capsys.readouterr().err


def test_only_and_skip_name_fields_that_have_flags():
    with pytest.raises(ValueError, match=r"Toy has no flag field\(s\) \['internal'\]"):
        add_flags(argparse.ArgumentParser(), Toy, only=["internal"])


def test_the_shared_options_defaults():
    # One default each, for the harness, the endpoint and the quickstart (tests/test_client_options.py).
    assert ClientOptions() == ClientOptions(timeout=300.0, timeout_per_token=0.1, max_retries=3, backoff=1.0)
    assert SamplingOptions() == SamplingOptions(temperature=0.7, top_p=0.95)  # the paper's


@pytest.mark.timeout(10)
def test_a_change_passed_to_from_args_wins_over_the_parsed_flag():
    # --chunk-size 64 on the command line, chunk_size=32 from the caller: the caller's change is the value (and a
    # flag nobody changed keeps what was parsed)
    args = toy_parser().parse_args(["a.txt", "--chunk-size", "64", "--mode", "b"])
    changed = from_args(Toy, args, chunk_size=32)
    assert (changed.chunk_size, changed.mode) == (32, "b")
