# The two commands of the README.
.PHONY: setup setup-gpu test lint

setup:
	bash scripts/setup.sh

setup-gpu:
	bash scripts/setup.sh --gpu

test:
	.venv/bin/python -m pytest

lint:
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
