#!/usr/bin/env bash
# MemAgent 7B RL training: the paper's run (Qwen2.5-7B-Instruct, 4 nodes x 8 GPUs; "at least 1 node, 4 nodes =
# 3~4 days to converge"), hyperparameters in configs/memagent_7b.yaml.
#   bash run_memory_7B.sh [hydra overrides]              DRY_RUN=1 bash run_memory_7B.sh   (print, do not run)
# Sync mode by default, as the released script (lockstep rounds: recurrent/generation_manager.py); MODE=async runs
# one coroutine per trajectory, same rows (docs/fidelity.md, "Sync and async mode").
# Environment knobs (PROJ_ROOT, DATASET_ROOT, MODEL_PATH, NNODES, NGPUS_PER_NODE, RAY_ADDRESS, MODE, RESUME,
# LOGGER, WANDB_OFFLINE, DUMP_ROLLOUTS, DRY_RUN) and the checkpoint export step: scripts/launch_memory.sh.
exec bash "$(dirname "$0")/scripts/launch_memory.sh" memagent_7b Qwen/Qwen2.5-7B-Instruct 4 "$@"
