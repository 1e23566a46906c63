"""``python -m experiments.needle.warm_start``: the command of :mod:`experiments.needle.warm_start.cli`."""

from experiments.needle.warm_start.cli import main

main()
