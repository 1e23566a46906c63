"""Files the endpoint's command reads that would have stopped it with a traceback or hung it (issue 47): an agent
file with a syntax error or a raise at import, a YAML alias bomb in --config or --agent-config. Each is one line
and exit 2, before any server starts."""

from __future__ import annotations

import pytest

from taskutils.endpoint.cli import parse_args

BOMB = "\n".join(
    [f"a0: &a0 [{', '.join(['x'] * 9)}]"] + [f"a{k}: &a{k} [{', '.join([f'*a{k - 1}'] * 9)}]" for k in range(1, 9)]
)
UPSTREAM = ["--model", "m", "--upstream", "http://127.0.0.1:9/v1"]  # never reached


def refused(argv: list[str], capsys) -> list[str]:
    with pytest.raises(SystemExit) as stop:
        parse_args(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.splitlines()


@pytest.mark.parametrize(
    ("source", "said"),
    [
        ("def broken(:\n", "SyntaxError: "),
        ("raise RuntimeError('no GPU here')\n", "RuntimeError: no GPU here"),
    ],
)
def test_an_agent_file_that_fails_on_import_is_one_line(tmp_path, capsys, source, said):
    agent = tmp_path / "my_agent.py"
    agent.write_text(source)
    lines = refused([*UPSTREAM, "--agent", str(agent)], capsys)
    assert lines[-1].startswith(f"python -m taskutils.endpoint: error: --agent {agent}: {agent}:1: {said}")
    assert lines[-1].endswith(f"(agent file {agent} failed on import)")


@pytest.mark.parametrize("option", ["--config", "--agent-config"])
def test_a_yaml_alias_bomb_is_one_line(tmp_path, capsys, option):
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(BOMB + "\n")
    lines = refused([*UPSTREAM, "--agent", "calculator", option, str(bomb)], capsys)
    assert f"{bomb}:" in lines[-1] and "with its aliases (*name) expanded it holds over 100,000 values" in lines[-1]
