#!/usr/bin/env bash
# Train with verl 0.9.1's V1 trainer on CPU, at tiny scale, with the trainer code GPU clusters run.
#
#   scripts/train_tiny_cpu.sh [hydra overrides...]
#
# TASK=memory (default): our trainer, `python -m verl_ext.main --config-name tiny_cpu` (the entry of the GPU runs:
#   RecurrentPPOTrainer, the `recurrent_agent` loop and its agent-loop manager), on a needle-in-a-haystack task made
#   here (experiments/tiny/data.py --task memory: documents of 2-4 chunks) with a dense reward next to the strict
#   verifier. configs/tiny_cpu.yaml carries the whole run; this script adds only what belongs to the machine and
#   the run folder (model folder, data files, ranks, steps, output folders, Ray temp dir, the environment).
# TASK=toy: verl's stock `python -m verl.trainer.main_ppo` (trainer.use_v1=True, trainer.v1.trainer_mode=sync) with
#   the stock `single_turn_agent` loop on a generated copy task (experiments/tiny/data.py) and a dense reward
#   (experiments/tiny/reward.py); verl's own config, so the CPU values are passed below.
# TASK=needle: our trainer with configs/replicate_cpu.yaml, the RL run of the CPU replication (docs/replication_cpu.md):
#   needle documents of 1-4 chunks (experiments/needle/needle.py), the strict reward; MODEL must be the warm
#   start (python -m experiments.needle.warm_start). scripts/replicate_cpu.sh calls it this way.
# CONFIG=<name> (any TASK): our trainer with configs/<name>.yaml, any agent (e.g. CONFIG=calculator_cpu), on
#   DATA_DIR/train.parquet and DATA_DIR/validation.parquet, which must exist (the config's task makes them).
#   CONFIG=<path>.yaml: a run config anywhere, composed on the repository's configs (its defaults may name
#   recurrent_trainer, cpu_platform, ...; Hydra reads it through --config-dir): its name must not be one of configs/.
# All: GRPO (memory n=4, toy n=2), KL loss against the ref policy, NGPUS FSDP2 ranks on gloo (fake Ray GPUs), the
# `hf_cpu` transformers rollout, validation before training and after every step, a checkpoint every step
# (resume_mode=auto; with the Hugging Face model), console + JSONL metrics, rollout and validation dumps. The CPU
# adaptations are verl_ext/cpu (README.md there); they load in every Ray process through
# VERL_USE_EXTERNAL_MODULES, and only because VERL_PLATFORM=cpu is set here.
# At the end: the reward per step (scripts/plot_training.py: a table, and OUT_DIR/training.png).
#
# Environment:
#   STEPS=2          total training steps (a rerun with a larger STEPS in the same OUT_DIR resumes)
#   OUT_DIR=...      everything the run writes: data/, checkpoints/, metrics.jsonl (this run; earlier runs
#                    metrics.N.jsonl), rollout/, validation/, hydra/, train.log (appended across runs; each run's
#                    last line says how it ended: "[supervise] done: exit status N", or "[supervise] killed: ..." when
#                    the supervisor was killed, written by this shell or by the next run), training.png.
#                    One run at a time: a second run on the same OUT_DIR stops at once (status 2), naming the first
#                    (a lock on OUT_DIR/checkpoints, held until the last process of the first run is gone)
#   TASK=memory      memory | toy | needle (see above)
#   CONFIG=...       a run config of configs/ (a name) or a YAML file anywhere (a path), instead of TASK's (see
#                    above); needs DATA_DIR
#   DRY_RUN=1        print the trainer's command and the composed config (resolved), then exit: nothing is trained
#   MODEL=...        model folder, or an offline model's name (tiny, smollm2-135m-instruct: materialized if
#                    missing); default: tiny
#   NGPUS=2          FSDP ranks (= fake Ray GPUs)
#   DATA_DIR=...     the task's data files (default OUT_DIR/data; made there when missing)
#   PYTHON=...       interpreter (default: the repo's .venv; with ROLLOUT=vllm, .venv-vllm-cpu)
#   ROLLOUT=hf_cpu   the rollout engine of our trainer (any TASK but toy): hf_cpu (the transformers server of
#                    verl_ext/cpu/rollout) or vllm (verl's own vLLM replica on vLLM 0.24.0's CPU build:
#                    configs/cpu_rollout/vllm.yaml, docs/cluster.md "vLLM on CPU"); vllm needs a model whose head
#                    size vLLM's CPU attention has (checked first; default MODEL then: tiny-head64)
# Extra arguments are passed to the trainer as hydra overrides (they come last, so they win), e.g.
# 'trainer.logger=[console,file,wandb]' (wandb runs offline: WANDB_MODE=offline, files under OUT_DIR/wandb).
# Runs from any working directory: relative paths (CONFIG, OUT_DIR, DATA_DIR, MODEL, overrides, an agent file named
# in the config's recurrent.agent) are read from the directory it is started in, the trainer's own working
# directory; this checkout's packages come first on every process's path (PYTHONPATH).
set -euo pipefail

if [[ "${1:-}" == -h || "${1:-}" == --help ]]; then sed -n '2,/^set -euo pipefail/p' "$0" | sed '$d'; exit 0; fi
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"  # inherited by Ray's daemons and workers
# absolute PATH: PATH as seen from the directory the script was started in (it never changes directory).
absolute() { if [[ "$1" == /* ]]; then echo "$1"; else echo "$PWD/$1"; fi; }
ROLLOUT="${ROLLOUT:-hf_cpu}"
case "$ROLLOUT" in
  hf_cpu) PYTHON="${PYTHON:-$REPO/.venv/bin/python}"; rollout_args=() ;;
  vllm) PYTHON="${PYTHON:-$REPO/.venv-vllm-cpu/bin/python}"; MODEL="${MODEL:-tiny-head64}"; rollout_args=(+cpu_rollout=vllm) ;;
  *) echo "ROLLOUT must be hf_cpu or vllm, got '$ROLLOUT'" >&2; exit 2 ;;
esac
if [[ ! -x "$PYTHON" ]]; then echo "PYTHON=$PYTHON: no interpreter there (make setup builds .venv and .venv-vllm-cpu)" >&2; exit 2; fi
STEPS="${STEPS:-2}"
OUT_DIR="${OUT_DIR:-$REPO/.cache/train_tiny_cpu}"
TASK="${TASK:-memory}"
NGPUS="${NGPUS:-2}"
mkdir -p "$OUT_DIR"
OUT_DIR="$(cd "$OUT_DIR" && pwd)"
source "$REPO/scripts/lib/session.sh"  # hold_run_lock, start_supervised, stop_supervised
hold_run_lock "$OUT_DIR/checkpoints"  # before anything in OUT_DIR changes (the metrics files below)

# --- environment of every process (the driver's env is inherited by Ray's raylet and workers; the CPU
# --- adaptations' variables are also put into Ray's runtime env below) --------------------------------
export VERL_PLATFORM=cpu
export VERL_USE_EXTERNAL_MODULES=verl_ext.cpu.load
export RAY_USAGE_STATS_ENABLED=0
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-disabled}"   # ray>=2.5x turns token auth on for new local clusters
export RAY_DEDUP_LOGS=0
export WANDB_MODE=offline WANDB_DIR="${WANDB_DIR:-$OUT_DIR}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false TQ_NUM_THREADS=1
export PYTHONUNBUFFERED=1
# verl's file logger truncates its file (utils/tracking.py FileLogger opens it "wb"): metrics.jsonl is this run's,
# an earlier run's (before a resume) is kept as metrics.1.jsonl, metrics.2.jsonl, ...
export VERL_FILE_LOGGER_PATH="$OUT_DIR/metrics.jsonl"
if [[ -s "$VERL_FILE_LOGGER_PATH" && "${DRY_RUN:-0}" != 1 ]]; then
  n=1; while [[ -e "$OUT_DIR/metrics.$n.jsonl" ]]; do n=$((n + 1)); done
  mv "$VERL_FILE_LOGGER_PATH" "$OUT_DIR/metrics.$n.jsonl"
fi
# Ray's Unix sockets live under its temp dir: keep the path short (108-byte limit), and unique per run.
RAY_TMP="$(mktemp -d -t rc.XXXXXX)"  # $TMPDIR or /tmp: short enough for Unix sockets

CONFIG="${CONFIG:-}"
if [[ -n "${DATA_DIR:-}" ]]; then
  if [[ -d "$DATA_DIR" ]]; then DATA_DIR="$(cd "$DATA_DIR" && pwd)"; else DATA_DIR="$(absolute "$DATA_DIR")"; fi
fi
if [[ -n "${MODEL:-}" && -d "$MODEL" ]]; then
  MODEL="$(cd "$MODEL" && pwd)"
elif [[ -n "${MODEL:-}" ]]; then  # an offline model's name (tiny, ...): its folder in the model cache, made if missing
  MODEL="$("$PYTHON" -c 'import sys; from recurrent.models import KNOWN_MODELS as known, materialize
name = sys.argv[1]; print(materialize(name) if name in known else name)' "$MODEL")"
fi  # else a model name for verl
if [[ -n "$CONFIG" ]]; then
  if [[ "$CONFIG" == */* || "$CONFIG" == *.yaml || "$CONFIG" == *.yml ]]; then
    # A run config anywhere: Hydra finds it through --config-dir, searched after configs/ (so its defaults name
    # the repository's configs), so a name of configs/ would read the repository's file instead.
    config_file="$(absolute "$CONFIG")"
    config_name="$(basename "$config_file" .yaml)"
    if [[ ! -f "$config_file" || "$config_file" != *.yaml ]]; then
      echo "CONFIG=$CONFIG: no YAML file at $config_file (Hydra reads run configs from .yaml files)" >&2; exit 2
    fi
    if [[ -f "$REPO/configs/$config_name.yaml" && ! "$config_file" -ef "$REPO/configs/$config_name.yaml" ]]; then
      echo "CONFIG=$CONFIG: configs/$config_name.yaml of the repository has its name, and Hydra would read that" \
        "one: rename $config_file" >&2
      exit 2
    fi
    config_args=(--config-dir "$(dirname "$config_file")" --config-name "$config_name")
  elif [[ -f "$REPO/configs/$CONFIG.yaml" ]]; then
    config_args=(--config-name "$CONFIG")
  else
    echo "CONFIG=$CONFIG: no configs/$CONFIG.yaml (CONFIG is a name in configs/ or the path of a YAML file)" >&2
    exit 2
  fi
  if [[ -z "${DATA_DIR:-}" || ! -f "$DATA_DIR/train.parquet" || ! -f "$DATA_DIR/validation.parquet" ]]; then
    echo "CONFIG=$CONFIG needs DATA_DIR holding train.parquet and validation.parquet" >&2; exit 2
  fi
  TASK=config
fi
if [[ "$ROLLOUT" == vllm && "$TASK" == toy ]]; then
  echo "ROLLOUT=vllm runs our trainer (TASK=memory, needle or CONFIG=...); TASK=toy is verl's main_ppo with hf_cpu" >&2
  exit 2
fi
if [[ "$TASK" == needle && -z "${MODEL:-}" ]]; then
  echo "TASK=needle needs MODEL=<warm-start folder> (python -m experiments.needle.warm_start --out DIR)" >&2
  exit 2
fi
MODEL="${MODEL:-$("$PYTHON" -c 'from recurrent.models import TINY, materialize; print(materialize(TINY))')}"
if [[ "$ROLLOUT" == vllm ]]; then  # before anything starts: vLLM's CPU attention has kernels for some head sizes only
  if ! problem="$(VLLM_LOGGING_LEVEL=ERROR "$PYTHON" -m verl_ext.cpu.vllm_cpu --check-model "$MODEL" 2>&1)"; then
    grep "^error:" <<<"$problem" >&2 || echo "$problem" >&2  # its one line, without vLLM's import chatter
    exit 2
  fi
  # vLLM's sampler compiles a kernel with inductor on CPU (torch.compile, eager mode or not): each run its own
  # cache, not the user's shared one that other runs write at the same time
  export TORCHINDUCTOR_CACHE_DIR="$OUT_DIR/inductor_cache"
fi
DATA="${DATA_DIR:-$OUT_DIR/data}"
case "$TASK" in
  toy) data_args=(--task copy --train 32 --val 4) ;;
  # 256 training questions: 64 steps of 4 before the data repeats (the run goes on: total_epochs 1000); 4 to validate.
  memory) data_args=(--task memory --train 256 --val 4) ;;
  # 2,000 training documents of 1-4 chunks; 8 validation documents at each of 1, 2 and 4 chunks.
  needle) data_args=(--train 2000 --validation 8 --test 0 --eval-chunks 1 2 4 --tokenizer "$MODEL") ;;
  config) data_args=() ;;
  *) echo "TASK must be toy, memory or needle, got '$TASK'" >&2; exit 2 ;;
esac
# Made once per OUT_DIR (deterministic for the seed): a resumed run reads the same files.
if [[ "$TASK" == config || "${DRY_RUN:-0}" == 1 ]]; then
  :  # the config's own data, in DATA_DIR (checked above); a dry run writes nothing
elif [[ "$TASK" == needle ]]; then
  if [[ ! -f "$DATA/train.parquet" || ! -f "$DATA/validation.parquet" ]]; then
    "$PYTHON" -m experiments.needle.data "${data_args[@]}" --out "$DATA" >/dev/null
  fi
elif [[ ! -f "$DATA/train.parquet" || ! -f "$DATA/val.parquet" ]]; then
  "$PYTHON" -m experiments.tiny.data "${data_args[@]}" --out "$DATA" >/dev/null
fi

# --- the machine and the run folder (any task) ----------------------------------------------------------------
machine_args=(
  "hydra.run.dir=$OUT_DIR/hydra/$(date +%Y%m%d-%H%M%S)"
  actor_rollout_ref.model.path="$MODEL"
  trainer.n_gpus_per_node="$NGPUS"
  ++ray_kwargs.ray_init.num_gpus="$NGPUS"
  ++ray_kwargs.ray_init._temp_dir="$RAY_TMP"
  trainer.total_training_steps="$STEPS"
  trainer.default_local_dir="$OUT_DIR/checkpoints"
  trainer.rollout_data_dir="$OUT_DIR/rollout"
  trainer.validation_data_dir="$OUT_DIR/validation"
)

# --- the task -----------------------------------------------------------------------------------------------
if [[ "$TASK" == config ]]; then
  entry=(-m verl_ext.main "${config_args[@]}")
  task_args=(
    data.train_files="$DATA/train.parquet"
    data.val_files="$DATA/validation.parquet"
  )
elif [[ "$TASK" == needle ]]; then
  # configs/replicate_cpu.yaml: tiny_cpu's CPU platform values plus the replication's budgets, reward and step shape.
  entry=(-m verl_ext.main --config-name replicate_cpu)
  task_args=(
    data.train_files="$DATA/train.parquet"
    data.val_files="$DATA/validation.parquet"
  )
elif [[ "$TASK" == memory ]]; then
  # configs/tiny_cpu.yaml: the CPU platform values, the budgets, the reward, validation/checkpoint cadence.
  entry=(-m verl_ext.main --config-name tiny_cpu)
  task_args=(
    data.train_files="$DATA/train.parquet"
    data.val_files="$DATA/dev.parquet"
  )
else
  entry=(-m verl.trainer.main_ppo)
  # `++` sets a key whether or not the composed config already has it.
  task_args=(
    # the CPU platform (configs/tiny_cpu.yaml holds the same values for the memory task)
    trainer.use_v1=True
    trainer.v1.trainer_mode=sync
    trainer.device=cpu
    trainer.nnodes=1
    # model and engines on CPU: sdpa attention, no flash-attn varlen path, no torch.compile, FSDP2 on gloo
    actor_rollout_ref.model.use_remove_padding=False
    actor_rollout_ref.model.enable_gradient_checkpointing=False
    ++actor_rollout_ref.model.override_config.attn_implementation=sdpa
    actor_rollout_ref.actor.strategy=fsdp2
    actor_rollout_ref.actor.use_torch_compile=False
    actor_rollout_ref.actor.fsdp_config.use_torch_compile=False
    actor_rollout_ref.ref.fsdp_config.use_torch_compile=False
    actor_rollout_ref.actor.fsdp_config.param_offload=False
    actor_rollout_ref.actor.fsdp_config.optimizer_offload=False
    actor_rollout_ref.ref.fsdp_config.param_offload=False
    # rollout: the transformers server of verl_ext/cpu/rollout, one replica per rank
    actor_rollout_ref.rollout.name=hf_cpu
    actor_rollout_ref.rollout.mode=async
    actor_rollout_ref.rollout.tensor_model_parallel_size=1
    # one agent-loop and one reward-loop worker: each is a Ray process importing torch and verl
    actor_rollout_ref.rollout.agent.num_workers=1
    reward.num_workers=1
    # validation before training and after every step, a checkpoint every step, resume from the last one
    trainer.total_epochs=1
    trainer.val_before_train=True
    trainer.test_freq=1
    trainer.save_freq=1
    trainer.resume_mode=auto
    'actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]'
    'trainer.logger=[console,file]'
    # Ray: logical CPUs (each worker bundle asks for 3), our env in every worker (quoted for hydra: Ray wants
    # strings, hydra would parse 1/false as int/bool)
    ray_kwargs.ray_init.num_cpus=16
    ++ray_kwargs.ray_init.include_dashboard=False
    "++ray_kwargs.ray_init.runtime_env.env_vars.VERL_PLATFORM='$VERL_PLATFORM'"
    "++ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES='$VERL_USE_EXTERNAL_MODULES'"
    "++ray_kwargs.ray_init.runtime_env.env_vars.OMP_NUM_THREADS='$OMP_NUM_THREADS'"
    "++ray_kwargs.ray_init.runtime_env.env_vars.TOKENIZERS_PARALLELISM='$TOKENIZERS_PARALLELISM'"
    "++ray_kwargs.ray_init.runtime_env.env_vars.TQ_NUM_THREADS='$TQ_NUM_THREADS'"
    # TransferQueue: verl's default 8 storage units (1 Ray CPU each) hang tq.init on a small Ray
    transfer_queue.backend.SimpleStorage.num_data_storage_units=2
    # the copy task
    algorithm.adv_estimator=grpo
    data.train_files="$DATA/train.parquet"
    data.val_files="$DATA/val.parquet"
    data.train_batch_size=4
    data.max_prompt_length=64
    data.max_response_length=16
    data.filter_overlong_prompts=True
    data.dataloader_num_workers=0
    actor_rollout_ref.actor.optim.lr=1e-4
    actor_rollout_ref.actor.ppo_mini_batch_size=4
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4
    actor_rollout_ref.actor.use_kl_loss=True
    actor_rollout_ref.actor.kl_loss_type=low_var_kl
    actor_rollout_ref.actor.kl_loss_coef=0.001
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4
    actor_rollout_ref.rollout.n=2
    actor_rollout_ref.rollout.max_model_len=80
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4
    actor_rollout_ref.rollout.agent.default_agent_loop=single_turn_agent
    reward.custom_reward_function.path=pkg://experiments.tiny.reward
    reward.custom_reward_function.name=compute_score
    trainer.project_name=tiny_cpu
    trainer.experiment_name=single_turn
  )
fi

if [[ "${DRY_RUN:-0}" == 1 ]]; then
  printf '[train_tiny_cpu] command:'; printf ' %q' "$PYTHON" "${entry[@]}" "${task_args[@]}" "${machine_args[@]}" ${rollout_args[@]+"${rollout_args[@]}"} "$@"
  echo; echo "[train_tiny_cpu] DRY_RUN=1: composed config follows; not starting"
  rm -rf "$RAY_TMP"
  exec "$PYTHON" "${entry[@]}" "${task_args[@]}" "${machine_args[@]}" ${rollout_args[@]+"${rollout_args[@]}"} "$@" --cfg job --resolve
fi

cleanup() {
  # The trainer runs in a session of its own under scripts/lib/supervise.py (start_supervised), with Ray's
  # daemons and workers: closing the lifeline has the supervisor end that session and remove Ray's temporary
  # folder. When this shell is killed (kill -9, of it or of its process group) no trap runs, and the lifeline
  # closes all the same.
  stop_supervised
  rm -rf "$RAY_TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "[train_tiny_cpu] task=$TASK${CONFIG:+ config=$CONFIG} steps=$STEPS out=$OUT_DIR ranks=$NGPUS model=$MODEL ray_tmp=$RAY_TMP"
start=$(date +%s)
set +e
# The supervisor appends the trainer's output to train.log itself: the log is whole even once this shell is gone.
start_supervised "$OUT_DIR/train.log" "$RAY_TMP" -- "$PYTHON" "${entry[@]}" "${task_args[@]}" "${machine_args[@]}" ${rollout_args[@]+"${rollout_args[@]}"} "$@"
echo "[train_tiny_cpu] trainer session=$SUPERVISOR_PID (the supervisor's: the trainer and Ray's processes run in it)"
wait "$SUPERVISOR_PID"
rc=$?
set -e
wall=$(( $(date +%s) - start ))
# The reward per step of this OUT_DIR (earlier runs' metrics.N.jsonl, then this run's) and a plot of it.
if [[ -s "$VERL_FILE_LOGGER_PATH" ]]; then
  "$PYTHON" "$REPO/scripts/plot_training.py" "$OUT_DIR" --out "$OUT_DIR/training.png" \
    || echo "[train_tiny_cpu] (plot_training.py failed; the run's rc is unaffected)"
fi
echo "[train_tiny_cpu] rc=$rc wall=${wall}s log=$OUT_DIR/train.log metrics=$VERL_FILE_LOGGER_PATH"
exit "$rc"
