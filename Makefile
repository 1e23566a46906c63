# The two commands of the README.
.PHONY: setup setup-gpu test lint

setup:
	bash scripts/setup.sh

setup-gpu:
	bash scripts/setup.sh --gpu

# Two worker processes, a test file each at a time (module fixtures such as a trainer run stay in one process):
# a trainer run's start-up is mostly one process importing at a time, so the other core runs other files.
# OMP_NUM_THREADS=1: a core per worker; two-thread torch in each oversubscribes the cores (the SmolLM2 quickstart
# test took 199 s beside a trainer run, 34 s alone). PYTHONFAULTHANDLER: a crash of any process (a worker, a server,
# a trainer) prints every thread's stack.
test:
	OMP_NUM_THREADS=1 PYTHONFAULTHANDLER=1 .venv/bin/python -m pytest -n 2 --dist loadfile --durations=15

lint:
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
