"""tests/yaml_memo.py: a config file parsed again gives what a fresh parse gives, an edited file its new content,
and one caller's change stays in its own copy."""

from __future__ import annotations

import omegaconf.omegaconf
from omegaconf import OmegaConf
from yaml_memo import memoize_yaml_parsing


def test_the_memo_is_installed_and_keyed_by_the_text(tmp_path):
    memo = memoize_yaml_parsing()
    assert omegaconf.omegaconf.yaml is memo  # installed by tests/conftest.py, once
    path = tmp_path / "a.yaml"
    path.write_text("trainer:\n  steps: 3\n  ratio: 1e-3\nname: a\n")
    hits = memo.hits
    first = OmegaConf.load(path)
    first.trainer.steps = 99  # a caller's change
    second = OmegaConf.load(path)
    assert memo.hits == hits + 1  # the second parse came from the memo
    assert OmegaConf.to_container(second) == {"trainer": {"steps": 3, "ratio": 0.001}, "name": "a"}
    path.write_text("trainer:\n  steps: 4\n")  # edited: parsed again
    assert OmegaConf.to_container(OmegaConf.load(path)) == {"trainer": {"steps": 4}}
    assert memo.hits == hits + 1


def test_duplicate_keys_are_still_refused(tmp_path):
    path = tmp_path / "dup.yaml"
    path.write_text("a: 1\na: 2\n")
    for _ in range(2):  # the refusal is not memoized away
        try:
            OmegaConf.load(path)
        except Exception as err:  # OmegaConf's loader raises a ConstructorError naming the key
            assert "a" in str(err)
        else:
            raise AssertionError("a duplicate key was accepted")
