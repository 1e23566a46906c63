"""The ``longbench`` and ``babilong`` stages: their options and their runs (the conversion: :mod:`.benchmarks`)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from recurrent.flags import flag
from recurrent.options import positive_int
from taskutils.memory_data.benchmarks import (
    BABILONG_CONFIGS,
    BABILONG_TASKS,
    LONGBENCH_SUBSETS,
    convert_babilong,
    convert_longbench,
)

SOURCES_HELP = "folder of the downloaded source files (default: <out>/sources)"
LIMIT_HELP = "only the first N records of every file (default: all)"


@dataclass(frozen=True)
class Longbench:
    out: Path | None = flag(None, "data folder for the eval sets (default: the data stages' data folder)", type=Path)
    sources: Path | None = flag(None, SOURCES_HELP, type=Path)
    subsets: list[str] = flag(
        help="LongBench's English QA subsets (default: all six)",
        factory=lambda: list(LONGBENCH_SUBSETS),
        nargs="+",
        choices=LONGBENCH_SUBSETS,
    )
    num_samples: int | None = flag(None, LIMIT_HELP, type=positive_int)


@dataclass(frozen=True)
class Babilong:
    out: Path | None = flag(None, "data folder for the eval sets (default: the data stages' data folder)", type=Path)
    sources: Path | None = flag(None, SOURCES_HELP, type=Path)
    tasks: list[str] = flag(
        help="BABILong tasks (default: qa1 ... qa5)",
        factory=lambda: list(BABILONG_TASKS),
        nargs="+",
        choices=BABILONG_TASKS,
    )
    configs: list[str] = flag(
        help="BABILong's length configs (default: all, 0k ... 1M)",
        factory=lambda: list(BABILONG_CONFIGS),
        nargs="+",
        choices=BABILONG_CONFIGS,
    )
    num_samples: int | None = flag(None, LIMIT_HELP, type=positive_int)


def run_longbench(args: argparse.Namespace, out: Path, sources: Path) -> int:
    for subset in args.subsets:
        report = convert_longbench(out, sources, subset, args.num_samples)
        print(f"{report.output}: {report.samples} items" + (" (already complete)" if report.skipped else ""))
    return 0


def run_babilong(args: argparse.Namespace, out: Path, sources: Path) -> int:
    for task in args.tasks:
        for config in args.configs:
            report = convert_babilong(out, sources, task, config, args.num_samples)
            print(f"{report.output}: {report.samples} items" + (" (already complete)" if report.skipped else ""))
    return 0
