"""The composed paper configs equal the paper's hyperparameters, key by key, from one table.

Sources, as the notes name them: "script" (the fork's run_memory_7B.sh / run_memory_14B.sh), "memory config"
(the fork's ``recurrent.memory`` section), "effective" (what a setting amounted to in the fork, e.g. vLLM's
context) and "fork default" (defaults of the fork the scripts relied on). Values are the *effective* ones: in
the fork ``data.max_prompt_length`` only sized vLLM, and the question budget was the memory config's. Where
verl 0.9.1 names a key differently from the fork, the note says so. Why each value is what it is:
``docs/fidelity.md``.
"""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf
from verl.trainer.ppo.utils import need_critic, need_reference_policy
from verl.utils.config import validate_config
from vx_helpers import compose_config

from recurrent.impls.memory import MemoryWorkflow
from verl_ext.rollout import Budgets, build_agent, check_budgets
from verl_ext.settings import recurrent_settings

AR = "actor_rollout_ref"
# (verl 0.9.1 key, 7B, 14B, source / note)
# fmt: off
PAPER = [
    (f"{AR}.model.path", "Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-14B-Instruct", "script: model"),
    ("trainer.nnodes", 4, 16, "script: nodes x GPUs"),
    ("trainer.n_gpus_per_node", 8, 8, "script: nodes x GPUs"),
    ("recurrent.mode", "sync", "sync", "script: the released runs' sync generation manager (verl_ext/sync_rollout.py)"),
    ("recurrent.config.chunk_size", 5000, 5000, "memory config / script: chunk_size"),
    ("recurrent.config.max_prompt_length", 1024, 1024, "memory config: the question budget"),
    ("recurrent.config.max_memorization_length", 1024, 1024, "memory config"),
    ("recurrent.config.max_chunks", 8, 8, "memory config, effective: contexts centre-truncated to 40,000 tokens"),
    ("recurrent.config.max_final_response_length", 1024, 1024, "memory config"),
    ("recurrent.config.context_key", "context", "context", "script: +data.context_key"),
    ("recurrent.config.final_prompt", "boxed_released", "boxed_released", "the fork's sync path: \\boxed{{}}"),
    ("recurrent.minibatch", "trajectory", "trajectory", "fork: train_batch_size // ppo_mini_batch_size updates"),
    ("data.train_batch_size", 128, 256, "script: prompts per step"),
    (f"{AR}.rollout.n", 16, 16, "script: group size"),
    (f"{AR}.actor.ppo_mini_batch_size", 8, 16, "script: prompts; verl counts n x this ROWS (recurrent.minibatch)"),
    (f"{AR}.actor.use_dynamic_bsz", True, True, "script"),
    (f"{AR}.actor.ppo_max_token_len_per_gpu", 16384, 16384, "script"),
    (f"{AR}.ref.log_prob_use_dynamic_bsz", True, True, "script (follows actor.use_dynamic_bsz)"),
    (f"{AR}.ref.log_prob_max_token_len_per_gpu", 32768, 32768, "script"),
    (f"{AR}.rollout.log_prob_use_dynamic_bsz", True, True, "script"),
    (f"{AR}.rollout.log_prob_max_token_len_per_gpu", 32768, 32768, "script"),
    (f"{AR}.actor.optim.lr", 1e-6, 1e-6, "script / fork default"),
    (f"{AR}.actor.optim.lr_warmup_steps", 20, 20, "script"),
    (f"{AR}.actor.optim.lr_scheduler_type", "constant", "constant", "script; the fork's warmup_style"),
    (f"{AR}.actor.optim.weight_decay", 0.01, 0.01, "fork default: AdamW"),
    (f"{AR}.actor.optim.clip_grad", 1.0, 1.0, "fork default: grad_clip (verl's engine reads optim.clip_grad)"),
    (f"{AR}.actor.clip_ratio_low", 0.2, 0.2, "fork default"),
    (f"{AR}.actor.clip_ratio_high", 0.2, 0.2, "script: clip_ratio_high=0.20, as low: clip-higher off"),
    (f"{AR}.actor.clip_ratio_c", 3.0, 3.0, "fork default: dual clip"),
    (f"{AR}.actor.entropy_coeff", 0, 0, "script"),
    (f"{AR}.actor.use_kl_loss", True, True, "script"),
    (f"{AR}.actor.kl_loss_coef", 0.001, 0.001, "script"),
    (f"{AR}.actor.kl_loss_type", "low_var_kl", "low_var_kl", "script"),
    (f"{AR}.actor.loss_agg_mode", "token-mean", "token-mean", "fork default"),
    (f"{AR}.actor.ppo_epochs", 1, 1, "fork default"),
    (f"{AR}.actor.shuffle", False, False, "fork default"),
    ("algorithm.adv_estimator", "grpo", "grpo", "script"),
    ("algorithm.norm_adv_by_std_in_grpo", False, False, "script: the fork's algorithm.grpo_use_adv=False"),
    ("algorithm.use_kl_in_reward", False, False, "fork default"),
    ("algorithm.kl_ctrl.kl_coef", 0.001, 0.001, "script (set, unused)"),
    ("algorithm.filter_groups.enable", False, False, "fork: dynamic sampling never active"),
    ("data.max_prompt_length", 8192, 8192, "script (in the fork it only sized vLLM)"),
    ("data.max_response_length", 1024, 1024, "script"),
    (f"{AR}.rollout.prompt_length", 8192, 8192, "effective: resolved before the dataset's 40,000"),
    (f"{AR}.rollout.response_length", 1024, 1024, "effective"),
    (f"{AR}.rollout.max_model_len", 9216, 9216, "effective: max_model_len = 8192 + 1024"),
    ("data.shuffle", False, False, "script: prompts in file order"),
    ("data.filter_overlong_prompts", True, True, "script"),
    ("data.dataloader_num_workers", 8, 8, "fork default: num_workers=8"),
    ("data.val_batch_size", None, None, "fork default: the whole dev set in one batch"),
    ("reward.custom_reward_function.path", "pkg://taskutils.verifiers.strict", "pkg://taskutils.verifiers.strict",
     "script: reward_manager=thread + the strict hotpotqa verifier; here verl's reward loop"),
    ("reward.reward_kwargs.overlong_buffer_cfg.enable", False, False, "fork default: no overlong shaping"),
    (f"{AR}.model.use_remove_padding", True, True, "script"),
    (f"{AR}.model.override_config.attn_implementation", "flash_attention_2", "flash_attention_2", "verl's default"),
    (f"{AR}.model.enable_gradient_checkpointing", True, True, "script"),
    (f"{AR}.actor.fsdp_config.param_offload", True, True, "script"),
    (f"{AR}.actor.fsdp_config.optimizer_offload", True, True, "script"),
    (f"{AR}.ref.fsdp_config.param_offload", True, True, "script"),
    (f"{AR}.actor.fsdp_config.fsdp_size", 8, 16, "script"),
    (f"{AR}.actor.ulysses_sequence_parallel_size", 1, 1, "script"),
    (f"{AR}.rollout.name", "vllm", "vllm", "script"),
    (f"{AR}.rollout.tensor_model_parallel_size", 1, 2, "script"),
    (f"{AR}.rollout.gpu_memory_utilization", 0.6, 0.6, "script"),
    (f"{AR}.rollout.enforce_eager", False, False, "script"),
    (f"{AR}.rollout.free_cache_engine", True, True, "script: False, but the fork slept vLLM after every rollout"),
    (f"{AR}.rollout.max_num_batched_tokens", 16384, 16384, "script"),
    (f"{AR}.rollout.max_num_seqs", 1024, 1024, "fork default (verl 0.9.1: 256)"),
    (f"{AR}.rollout.enable_chunked_prefill", True, True, "fork default"),
    (f"{AR}.rollout.temperature", 1.0, 1.0, "script"),
    (f"{AR}.rollout.top_p", 1.0, 1.0, "script"),
    (f"{AR}.rollout.top_k", -1, -1, "fork default"),
    (f"{AR}.rollout.val_kwargs.do_sample", True, True, "script / fork default"),
    (f"{AR}.rollout.val_kwargs.temperature", 1.0, 1.0, "script / fork default"),
    (f"{AR}.rollout.val_kwargs.top_p", 0.7, 0.7, "script / fork default"),
    (f"{AR}.rollout.val_kwargs.top_k", -1, -1, "fork default"),
    (f"{AR}.rollout.val_kwargs.n", 4, 4, "script / fork default"),
    ("trainer.val_before_train", True, True, "script"),
    ("trainer.test_freq", 5, 5, "script"),
    ("trainer.save_freq", 10, 10, "script"),
    ("trainer.total_epochs", 30, 30, "script"),
    ("trainer.critic_warmup", 0, 0, "script"),
    ("trainer.logger", ["console", "wandb"], ["console", "wandb"], "script"),
    ("trainer.experiment_name", "memory_agent/7B", "memory_agent/14B", "script"),
    # verl 0.9.1 plumbing for the above (not paper hyperparameters):
    ("trainer.use_v1", True, True, "V1 trainer (multi-output agent loops)"),
    ("trainer.v1.trainer_mode", "sync", "sync", "verl compares trainer_mode with the literal \"sync\""),
    (f"{AR}.rollout.agent.default_agent_loop", "recurrent_agent", "recurrent_agent", "our agent loop"),
    (f"{AR}.rollout.agent.agent_loop_manager_class", "verl_ext.agent_loop_manager.LockstepAgentLoopManager",
     "verl_ext.agent_loop_manager.LockstepAgentLoopManager", "recurrent.mode=sync: the lockstep rounds"),
]
# fmt: on


@pytest.fixture(scope="module")
def composed(tmp_path_factory):
    # As on the paper's machines, with flash-attn installed (only its presence is asked:
    # verl_ext/attention.py);
    # without it two settings change, tested in test_vx_attention.py.
    stand_in = tmp_path_factory.mktemp("site") / "flash_attn"
    stand_in.mkdir()
    (stand_in / "__init__.py").write_text("")
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(stand_in.parent))
        configs = {size: compose_config(f"memagent_{size}") for size in ("7b", "14b")}
        for config in configs.values():
            OmegaConf.resolve(config)
    return configs


@pytest.mark.parametrize(("key", "expected_7b", "expected_14b", "source"), PAPER, ids=[row[0] for row in PAPER])
def test_paper_hyperparameter(composed, key, expected_7b, expected_14b, source):
    for size, expected in (("7b", expected_7b), ("14b", expected_14b)):
        value = OmegaConf.select(composed[size], key, throw_on_missing=True)
        if OmegaConf.is_config(value):
            value = OmegaConf.to_container(value)
        assert value == expected and type(value) is type(expected), f"{size} {key} ({source})"


def test_data_files_are_the_papers(composed):
    for config in composed.values():
        assert config.data.train_files.endswith("hotpotqa/hotpotqa_train_32k.parquet")
        assert config.data.val_files.endswith("hotpotqa/hotpotqa_dev.parquet")


def test_verl_accepts_the_configs(composed):
    for config in composed.values():
        validate_config(config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
        assert need_reference_policy(config) and not need_critic(config)  # KL loss needs the reference, no critic


def test_the_paper_budgets_fit_a_real_instruct_tokenizer(composed, smollm2_dir):
    from transformers import AutoTokenizer

    config = composed["7b"]
    workflow = build_agent(recurrent_settings(config), AutoTokenizer.from_pretrained(smollm2_dir))
    assert isinstance(workflow, MemoryWorkflow)
    check_budgets(workflow, Budgets(8192, 1024))
    widths = workflow.row_widths()
    prompt, response = widths.prompt, widths.response
    assert 1024 + 5000 + 1024 < prompt <= 8192 and response == 1024  # the paper's "8K context"


def test_budgets_that_do_not_fit_are_named(tiny_tokenizer):
    settings = recurrent_settings(compose_config("memagent_7b"))
    with pytest.raises(ValueError, match=r"rollout.prompt_length \(data.max_prompt_length\) is 4096"):
        check_budgets(build_agent(settings, tiny_tokenizer), Budgets(4096, 1024))
    with pytest.raises(ValueError, match=r"max_memorization_length=1024.*response_length .* is 512"):
        check_budgets(build_agent(settings, tiny_tokenizer), Budgets(8192, 512))


def test_tiny_cpu_config_composes_and_fits(tiny_model_dir, tiny_tokenizer):
    config = compose_config("tiny_cpu", [f"actor_rollout_ref.model.path={tiny_model_dir}"])
    OmegaConf.resolve(config)
    rollout = config.actor_rollout_ref.rollout
    check_budgets(
        build_agent(recurrent_settings(config), tiny_tokenizer),
        Budgets(rollout.prompt_length, rollout.response_length),
    )
    assert rollout.max_model_len == rollout.prompt_length + rollout.response_length
    assert (config.trainer.device, rollout.name, config.trainer.v1.trainer_mode) == ("cpu", "hf_cpu", "sync")
    validate_config(config, use_reference_policy=True, use_critic=False)


def test_the_replication_run_is_the_papers_algorithm_at_cpu_scale():
    """configs/replicate_cpu.yaml (docs/replication_cpu.md): the paper's algorithm, the issue's step shape, the
    strict reward, and budgets that hold the reader's longest memory turn."""
    from experiments.needle.reader import build_tokenizer
    from verl_ext.minibatch import updates_per_step

    config = compose_config("replicate_cpu")
    OmegaConf.resolve(config)
    actor, rollout = config[AR].actor, config[AR].rollout
    # the paper's algorithm: GRPO without std division, KL loss, every turn credited, trajectory mini-batches
    assert config.algorithm.adv_estimator == "grpo" and config.algorithm.norm_adv_by_std_in_grpo is False
    assert (actor.use_kl_loss, actor.kl_loss_type, actor.kl_loss_coef) == (True, "low_var_kl", 0.001)
    assert (config.recurrent.credit, config.recurrent.minibatch, actor.loss_agg_mode) == (
        "all",
        "trajectory",
        "token-mean",
    )
    # the step: GRPO n >= 4, 16 optimizer updates per step (the paper's 128 / 8)
    assert rollout.n >= 4 and rollout.temperature == 1.0
    assert updates_per_step(config.data.train_batch_size, actor.ppo_mini_batch_size) == 16
    # the strict verifier as the reward (not tiny_cpu's dense test reward), greedy validation
    assert (config.reward.custom_reward_function.path, config.reward.custom_reward_function.name) == (
        "pkg://taskutils.verifiers.strict",
        "compute_score",
    )
    assert (rollout.val_kwargs.temperature, rollout.val_kwargs.n) == (0, 1)
    # fp32 compute on CPU (bf16 autocast is emulated on CPUs without bf16 instructions)
    for fsdp in (actor.fsdp_config, config[AR].ref.fsdp_config):
        assert fsdp.mixed_precision.param_dtype == "fp32"
    # budgets: the reader's memory turn (template + question + 64-token chunk + 32-token memory) fits
    settings = recurrent_settings(config)
    assert (settings.agent_config["chunk_size"], settings.agent_config["max_memorization_length"]) == (64, 32)
    check_budgets(build_agent(settings, build_tokenizer()), Budgets(rollout.prompt_length, rollout.response_length))
    assert rollout.max_model_len >= rollout.prompt_length + rollout.response_length


def test_the_helpers_composed_configs_are_hydras_and_a_change_to_one_stays_in_it():
    """vx_helpers.compose_config composes each name and overrides once per process: every call still gets Hydra's
    config, as its own copy."""
    from hydra import compose, initialize_config_dir
    from vx_helpers import CONFIG_DIR

    first = compose_config("tiny_cpu", ["trainer.total_epochs=3"])
    first.trainer.total_epochs = 99
    second = compose_config("tiny_cpu", ["trainer.total_epochs=3"])
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        hydras = compose(config_name="tiny_cpu", overrides=["trainer.total_epochs=3"])
    assert second.trainer.total_epochs == 3
    assert OmegaConf.to_container(second) == OmegaConf.to_container(hydras)
