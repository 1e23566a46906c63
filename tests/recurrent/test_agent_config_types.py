"""An agent config's values are of their fields' types wherever they are read (recurrent/interface.py,
``make_config``: training's ``recurrent.config``, the preflight, the step plan; recurrent/options.py, an
``--agent-config`` file of the harness and the endpoint): a bool is no int, so ``max_turns: true`` is refused naming
its key rather than read as 1 call."""

from __future__ import annotations

import pytest

from recurrent.interface import load_register
from recurrent.options import ConfigError, agent_config

CALCULATOR = load_register("calculator")  # max_turns: int = 5


@pytest.mark.timeout(10)
@pytest.mark.parametrize(("value", "shown"), [(True, "True"), (False, "False"), (2.0, "2.0"), ("2", "'2'")])
def test_a_value_of_another_type_for_an_integer_field_is_refused_naming_it(value, shown):
    with pytest.raises(ValueError) as raised:
        CALCULATOR.make_config({"max_turns": value})
    assert str(raised.value) == f"agent 'calculator' (CalculatorConfig): max_turns: {shown} is not of type int"


@pytest.mark.timeout(10)
def test_an_integer_is_taken_as_it_is():
    assert CALCULATOR.make_config({"max_turns": 2}).max_turns == 2


@pytest.mark.timeout(10)
def test_a_config_files_bool_for_an_integer_field_is_refused_at_its_line(tmp_path):
    path = tmp_path / "calculator.yaml"
    path.write_text("max_tokens_per_turn: 32\nmax_turns: true\n")
    with pytest.raises(ConfigError) as raised:
        agent_config(CALCULATOR, path)
    assert str(raised.value) == f"{path}:2: max_turns: True is not of type int"
