"""What a checkpoint of each run config holds (docs/cluster.md, "After training: checkpoint to served model"): the GPU
runs save FSDP shards only, so their model is evaluated through verl's model merger; the CPU runs also export a
Hugging Face folder at every checkpoint. Read as verl's checkpoint managers read it: ``save_contents`` of the
actor's ``CheckpointConfig``, where ``hf_model`` switches the export on (``should_save_hf_model``)."""

from __future__ import annotations

import pytest
from verl.trainer.config import CheckpointConfig
from verl.utils.config import omega_conf_to_dataclass
from vx_helpers import compose_config


@pytest.mark.parametrize(
    ("config_name", "save_contents"),
    [
        ("memagent_7b", ["model", "optimizer", "extra"]),
        ("memagent_14b", ["model", "optimizer", "extra"]),
        ("smoke_gpu", ["model", "optimizer", "extra"]),
        ("tiny_cpu", ["model", "optimizer", "extra", "hf_model"]),
        ("replicate_cpu", ["model", "optimizer", "extra", "hf_model"]),
    ],
)
def test_what_each_run_saves_at_a_checkpoint(config_name, save_contents):
    checkpoint = omega_conf_to_dataclass(compose_config(config_name).actor_rollout_ref.actor.checkpoint)
    assert isinstance(checkpoint, CheckpointConfig)
    assert list(checkpoint.save_contents) == save_contents
    # a resume loads what was saved
    assert list(checkpoint.load_contents) == save_contents
