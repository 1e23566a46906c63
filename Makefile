# The two commands of the README.
.PHONY: setup setup-gpu test lint

setup:
	bash scripts/setup.sh

setup-gpu:
	bash scripts/setup.sh --gpu

# Two worker processes, a test file each at a time (module fixtures such as a trainer run stay in one process):
# a trainer run's start-up is mostly one process importing at a time, so the other core runs other files.
# PYTHONFAULTHANDLER: a crash of any process (a worker, a server, a trainer) prints every thread's stack.
test:
	PYTHONFAULTHANDLER=1 .venv/bin/python -m pytest -n 2 --dist loadfile --durations=15

lint:
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
