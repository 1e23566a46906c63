#!/usr/bin/env bash
# MemAgent 14B RL training: the paper's run (Qwen2.5-14B-Instruct, 16 nodes x 8 GPUs; "at least 2 nodes, 16 nodes
# = 1 day to converge"), hyperparameters in configs/memagent_14b.yaml.
#   bash run_memory_14B.sh [hydra overrides]             DRY_RUN=1 bash run_memory_14B.sh  (print, do not run)
# Sync mode by default, as the released script (lockstep rounds: recurrent/generation_manager.py); MODE=async runs
# one coroutine per trajectory, same rows (docs/fidelity.md, "Sync and async mode").
# Environment knobs (PROJ_ROOT, DATASET_ROOT, MODEL_PATH, NNODES, NGPUS_PER_NODE, RAY_ADDRESS, MODE, RESUME,
# LOGGER, WANDB_OFFLINE, DUMP_ROLLOUTS, DRY_RUN) and the checkpoint export step: scripts/launch_memory.sh.
exec bash "$(dirname "$0")/scripts/launch_memory.sh" memagent_14b Qwen/Qwen2.5-14B-Instruct 16 "$@"
