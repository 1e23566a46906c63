"""Inputs of a training run that passed the preflight and failed later, with Ray up, in a traceback (issue 47): a
batch size of 0 or below, an agent file with a syntax error or a raise at import, a run config that is a YAML alias
bomb. Each is named in one line before Ray starts."""

from __future__ import annotations

import pytest
from test_vx_preflight import ROW, config_for, write

from verl_ext.main import check_run_config
from verl_ext.preflight import PreflightError, preflight

BOMB = "\n".join(
    [f"a0: &a0 [{', '.join(['x'] * 9)}]"] + [f"a{k}: &a{k} [{', '.join([f'*a{k - 1}'] * 9)}]" for k in range(1, 9)]
)


@pytest.mark.parametrize(
    ("override", "said"),
    [
        ("data.train_batch_size=-4", "data.train_batch_size=-4: a batch size is a whole number >= 1"),
        ("data.train_batch_size=0", "data.train_batch_size=0: a batch size is a whole number >= 1"),
        ("data.val_batch_size=0", "data.val_batch_size=0: a batch size is a whole number >= 1"),
        ("actor_rollout_ref.actor.ppo_mini_batch_size=0", "ppo_mini_batch_size=0: a batch size is a whole number"),
    ],
)
def test_a_batch_size_below_one_is_refused_naming_the_key(tmp_path, override, said):
    data = write(tmp_path / "train.parquet", [ROW])
    with pytest.raises(PreflightError, match=said.replace("(", r"\(").replace(".", r"\.")):
        preflight(config_for(data, data, "tiny", override), load_tokenizer=False)


@pytest.mark.parametrize(
    ("source", "said"),
    [("def broken(:\n", "SyntaxError: "), ("raise RuntimeError('no GPU')\n", "RuntimeError: no GPU")],
)
def test_an_agent_file_that_fails_on_import_is_named_in_one_line(tmp_path, source, said):
    agent = tmp_path / "my_agent.py"
    agent.write_text(source)
    data = write(tmp_path / "train.parquet", [ROW])
    with pytest.raises(PreflightError) as err:
        preflight(config_for(data, data, "tiny", f"recurrent.agent={agent}"), load_tokenizer=False)
    assert f"recurrent.agent='{agent}': {agent}:1: {said}" in str(err.value)
    assert f"(agent file {agent} failed on import)" in str(err.value)


def test_a_run_config_that_is_an_alias_bomb_is_one_line_before_hydra_reads_it(tmp_path, capsys):
    (tmp_path / "bomb.yaml").write_text(BOMB + "\n")
    with pytest.raises(SystemExit) as stop:
        check_run_config(["--config-dir", str(tmp_path), "--config-name", "bomb", "trainer.total_epochs=1"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.startswith(
        f"[memagent] the run config cannot be read: {tmp_path / 'bomb.yaml'}:"
    )
    assert "with its aliases (*name) expanded it holds over 100,000 values" in err
    check_run_config(["--config-name", "tiny_cpu"])  # the repository's configs pass


@pytest.mark.timeout(60)
def test_a_bool_for_an_integer_setting_of_the_agent_is_refused_naming_it(tmp_path):
    # recurrent.config.max_chunks=true would read as 1 chunk: a bool is no int (recurrent/interface.py, make_config)
    data = write(tmp_path / "train.parquet", [ROW])
    with pytest.raises(PreflightError) as err:
        preflight(config_for(data, data, "tiny", "recurrent.config.max_chunks=true"), load_tokenizer=False)
    assert "agent 'memory' (MemoryConfig): max_chunks: True is not of type int | None" in str(err.value)
