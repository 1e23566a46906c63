#!/usr/bin/env bash
# Launch a MemAgent RL training run (verl_ext.main) on one node or on a Ray cluster.
# Called by run_memory_7B.sh / run_memory_14B.sh:  launch_memory.sh CONFIG DEFAULT_MODEL DEFAULT_NNODES [overrides]
#
# Environment (all optional):
#   PROJ_ROOT       where runs go: $PROJ_ROOT/memory_agent/<size>/ (<size>_async with MODE=async) holds checkpoints (global_step_N/), rollout
#                   dumps and Hydra logs (default: <repository>/checkpoints, git-ignored)
#   DATASET_ROOT    holds hotpotqa/hotpotqa_train_32k.parquet and hotpotqa/hotpotqa_dev.parquet
#                   (columns prompt, context, data_source, reward_model.ground_truth; default: <repository>/data):
#                   the folder the data stages write (python -m taskutils.memory_data hotpotqa-filter) and the
#                   released files go (hf download BytedTsinghua-SIA/hotpotqa --repo-type dataset --local-dir
#                   data/hotpotqa). The original's DATAROOT (that hotpotqa folder itself) or MEMAGENT_DATA_DIR
#                   choose it too (taskutils/data_root.py); a hotpotqa_train.parquet (the original filter2.py's
#                   name) is read when hotpotqa_train_32k.parquet is absent
#   MODEL_PATH      a local model folder, or a hub id already in the local Hugging Face cache (nothing is
#                   downloaded at run time; on a cluster, a folder every node can read)
#   NNODES, NGPUS_PER_NODE   cluster shape (defaults: the paper's)
#   RAY_ADDRESS     join an existing Ray cluster ("auto" on its head node); unset: start Ray on this node
#   MODE            sync (default: the released runs' mode, lockstep rounds: recurrent/generation_manager.py) |
#                   async (one coroutine per trajectory; same rows: docs/fidelity.md, "Sync and async mode"), in
#                   its own run folder memory_agent/<size>_async, as the original's run_memory_7B_async.sh
#   RESUME          auto (default: the latest checkpoint of the run folder) | disable | a global_step_N folder
#   LOGGER          console,wandb (default; the paper's) | console | console,file | console,tensorboard
#   WANDB_OFFLINE   1: wandb logs locally (upload later with `wandb sync`)
#   DUMP_ROLLOUTS   1: every training rollout (all memory turns) and validation generation as JSONL
#                   under the run folder (rollouts/<step>.jsonl, validation/<step>.jsonl)
#   DRY_RUN         1: print the command and the composed config (resolved), then exit (no Ray, no GPU)
#   PYTHON          the interpreter (default: the repository's .venv, else python3)
# Extra arguments are Hydra overrides, e.g. trainer.total_epochs=1 actor_rollout_ref.actor.clip_ratio_high=0.28
#
# One run at a time per run folder: a launch on a folder another run holds stops at once (status 2), naming it.
# Before anything starts, the run checks on this machine that the data files exist and have the columns,
# that the model folder exists, and that the token budgets fit; it stops with a list of problems otherwise.
#
# Several nodes: start Ray yourself with the same environment and code on every node
#   (head)   ray start --head --port=6379        (others) ray start --address=<head-ip>:6379
# then run the script on the head node with RAY_ADDRESS=auto NNODES=<n>. The data, the model folder and PROJ_ROOT
# must be on storage every node reads at the same path, and secrets (WANDB_API_KEY) exported before `ray start` on
# every node: none is forwarded through the config, which verl prints (docs/cluster.md). Before anything starts, the
# task runner checks GPUs, CPUs, the wandb key and the paths on its node, then the paths on every other node; a
# problem stops the run with a message naming the node (exit status 2).
#
# Export a trained checkpoint as a Hugging Face folder (for `vllm serve` and the evaluation harness):
#   python -m verl.model_merger merge --backend fsdp \
#       --local_dir  $PROJ_ROOT/memory_agent/<size>/global_step_<N>/actor \
#       --target_dir $PROJ_ROOT/memory_agent/<size>/hf/global_step_<N>
#   vllm serve $PROJ_ROOT/memory_agent/<size>/hf/global_step_<N>
set -euo pipefail

if [ $# -lt 3 ]; then
  sed -n '2,40p' "$0"; exit 2
fi
CONFIG=$1; DEFAULT_MODEL=$2; DEFAULT_NNODES=$3; shift 3

REPO=$(cd "$(dirname "$0")/.." && pwd)
# Runs from any working directory: this checkout's packages first on the path (Ray's local workers inherit it),
# relative folders read from the directory it is started in and passed on absolute (the Ray workers' may differ).
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
absolute() { if [[ "$1" == /* ]]; then echo "$1"; else echo "$PWD/$1"; fi; }
PROJ_ROOT_SET=${PROJ_ROOT:-}
PROJ_ROOT=$(absolute "${PROJ_ROOT:-$REPO/checkpoints}")
DATASET_ROOT=$(absolute "${DATASET_ROOT:-$REPO/data}")
export DATASET_ROOT  # the data folder below is $DATASET_ROOT/hotpotqa unless DATAROOT or MEMAGENT_DATA_DIR says
MODEL_PATH=${MODEL_PATH:-$DEFAULT_MODEL}
if [ -d "$MODEL_PATH" ]; then MODEL_PATH=$(cd "$MODEL_PATH" && pwd); fi  # a folder; else a hub id
NNODES=${NNODES:-$DEFAULT_NNODES}
NGPUS_PER_NODE=${NGPUS_PER_NODE:-8}
MODE=${MODE:-sync}
case "$MODE" in
  sync|async) ;;
  *) echo "[memagent] MODE=$MODE: one of sync (the released runs' lockstep rounds) or async" >&2; exit 2 ;;
esac
RESUME=${RESUME:-auto}
LOGGER=${LOGGER:-console,wandb}
if [ -z "${PYTHON:-}" ]; then
  if [ -x "$REPO/.venv/bin/python" ]; then PYTHON=$REPO/.venv/bin/python; else PYTHON=python3; fi
fi
SIZE=${CONFIG#memagent_}; SIZE=${SIZE^^}
EXPERIMENT=memory_agent/$SIZE
if [ "$MODE" = async ]; then EXPERIMENT=${EXPERIMENT}_async; fi  # its own checkpoints: a resume never mixes modes
RUN_DIR=$PROJ_ROOT/$EXPERIMENT
export PROJ_ROOT
export RECURRENT_LAUNCHER=1  # the checks name MODEL_PATH, this launcher's way to give the model
# One data folder for the data stages, the harness and this launcher (taskutils/data_root.py).
TRAIN_FILE=$("$PYTHON" -m taskutils.data_root --train)
DEV_FILE=$("$PYTHON" -m taskutils.data_root --dev)

ARGS=(
  --config-name "$CONFIG"
  "actor_rollout_ref.model.path=$MODEL_PATH"
  "data.train_files=$TRAIN_FILE"
  "data.val_files=$DEV_FILE"
  "trainer.nnodes=$NNODES"
  "trainer.n_gpus_per_node=$NGPUS_PER_NODE"
  "trainer.default_local_dir=$RUN_DIR"
  "trainer.experiment_name=$EXPERIMENT"
  "trainer.logger=[$LOGGER]"
  "recurrent.mode=$MODE"
  "hydra.run.dir=$RUN_DIR/hydra/\${now:%Y-%m-%d_%H-%M-%S}"
)
case "$RESUME" in
  auto|disable) ARGS+=("trainer.resume_mode=$RESUME") ;;
  *) ARGS+=("trainer.resume_mode=resume_path" "trainer.resume_from_path=$RESUME") ;;
esac
if [ "${DUMP_ROLLOUTS:-0}" = 1 ]; then
  ARGS+=("trainer.rollout_data_dir=$RUN_DIR/rollouts" "trainer.validation_data_dir=$RUN_DIR/validation")
fi
if [ "${WANDB_OFFLINE:-0}" = 1 ]; then
  export WANDB_MODE=offline
  ARGS+=("+ray_kwargs.ray_init.runtime_env.env_vars.WANDB_MODE=offline")  # also on a remote cluster's nodes
fi
ARGS+=("$@")

echo "[memagent] ${RAY_ADDRESS:+Ray cluster $RAY_ADDRESS, }$NNODES node(s) x $NGPUS_PER_NODE GPU(s), run folder $RUN_DIR"
echo "[memagent] data: $TRAIN_FILE, $DEV_FILE ($("$PYTHON" -m taskutils.data_root | sed 's/.* (/from /; s/)$//'))"
if [ "$MODE" = sync ]; then
  echo "[memagent] rollout mode: sync (lockstep rounds, answers last: the released runs' schedule; MODE=async for one coroutine per trajectory)"
else
  echo "[memagent] rollout mode: async (one coroutine per trajectory; MODE=sync replays the released runs' lockstep rounds)"
fi
if [ -n "${RAY_ADDRESS:-}" ] && [ -z "${PROJ_ROOT_SET:-}" ]; then
  echo "[memagent] note: PROJ_ROOT is not set; checkpoints go under the repository ($RUN_DIR), which every node" \
    "must reach at the same path (shared storage; docs/cluster.md)"
fi
printf '[memagent] command:'; printf ' %q' "$PYTHON" -m verl_ext.main "${ARGS[@]}"; echo
if [ "${DRY_RUN:-0}" = 1 ]; then
  echo "[memagent] DRY_RUN=1: composed config follows; not starting"
  exec "$PYTHON" -m verl_ext.main "${ARGS[@]}" --cfg job --resolve
fi
# One run per run folder: a second launch on it stops here (status 2) naming the first. The trainer below is this
# process (exec), so it holds the lock until it ends; a local Ray's daemons are tied to it by Ray itself (started
# with the kernel's parent-death signal on Linux).
source "$REPO/scripts/lib/session.sh"  # hold_run_lock
hold_run_lock "$RUN_DIR"
exec "$PYTHON" -m verl_ext.main "${ARGS[@]}"
