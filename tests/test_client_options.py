"""The client options (--timeout, --timeout-per-token, --max-retries, --backoff) are one definition,
recurrent/flags.py's ClientOptions, in the three commands that talk to a model server: the harness
(`python -m taskutils.memory_eval.run`), the endpoint (`python -m taskutils.endpoint`) and `quickstart.py`. Each
command has the same defaults, and refuses a value that is not finite, or negative, with exit 2 and one error line
naming the option, before anything starts."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from recurrent.flags import ClientOptions, from_args
from taskutils.endpoint import cli as endpoint_cli
from taskutils.memory_eval import arguments as harness_arguments

REPO = Path(__file__).resolve().parent.parent
UPSTREAM = ["--model", "x", "--upstream", "http://127.0.0.1:9/v1"]


def quickstart_parse(argv: list[str]):
    spec = importlib.util.spec_from_file_location("quickstart_options", REPO / "quickstart.py")
    quickstart = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(quickstart)
    return quickstart.build_parser().parse_args(argv)


COMMANDS = {
    "harness": harness_arguments.parse_args,
    "endpoint": lambda argv: endpoint_cli.parse_args([*UPSTREAM, *argv]),
    "quickstart": quickstart_parse,
}


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_the_same_client_defaults(command):
    expected = ClientOptions(timeout=300.0, timeout_per_token=0.1, max_retries=3, backoff=1.0)
    assert from_args(ClientOptions, COMMANDS[command]([])) == expected
    given = ["--timeout", "60", "--timeout-per-token", "0", "--max-retries", "0", "--backoff", "0.5"]
    assert from_args(ClientOptions, COMMANDS[command](given)) == ClientOptions(60.0, 0.0, 0, 0.5)


BAD = [
    ("--timeout", "inf", "must be a finite number of seconds > 0, got inf"),
    ("--timeout", "0", "must be a finite number of seconds > 0, got 0"),
    ("--timeout-per-token", "inf", "must be a finite number of seconds >= 0, got inf"),
    ("--timeout-per-token", "nan", "must be >= 0 seconds, got nan"),
    ("--timeout-per-token", "-0.5", "must be >= 0 seconds, got -0.5"),
    ("--backoff", "nan", "must be >= 0 seconds, got nan"),
    ("--backoff", "-1", "must be >= 0 seconds, got -1"),
    ("--backoff", "inf", "must be a finite number of seconds >= 0, got inf"),
    ("--max-retries", "-1", "must be an integer >= 0, got -1"),
    ("--max-retries", "1.5", "must be an integer, got '1.5'"),
]


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize(("flag", "value", "said"), BAD)
def test_every_command_refuses_a_value_that_is_not_finite_or_negative(capsys, command, flag, value, said):
    with pytest.raises(SystemExit) as stop:
        COMMANDS[command]([flag, value])
    assert stop.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(errors) == 1 and errors[0].endswith(f"error: argument {flag}: {said}")
