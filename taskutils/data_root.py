"""The one data folder of the paper's data: where the data stages write, the harness reads its eval sets and the
training launchers read their parquet files, whatever the working directory.

The folder is the first of: a folder given on the command line (``--out``, ``--data-dir``),
``$MEMAGENT_DATA_DIR``, the original's ``$DATAROOT`` (the folder of the released ``BytedTsinghua-SIA/hotpotqa``
files), ``$DATASET_ROOT/hotpotqa`` (the original launchers' layout), ``<repository>/data/hotpotqa``. The released
files go there as they are: ``hf download BytedTsinghua-SIA/hotpotqa --repo-type dataset --local-dir
data/hotpotqa``.

``python -m taskutils.data_root`` prints the folder and where it came from; ``--train``/``--dev`` print the
training launchers' parquet files (scripts/launch_memory.sh reads them so).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]
DATA_DIR_ENV = "MEMAGENT_DATA_DIR"
# The training file: what `hotpotqa-filter` writes and the original launchers read (32,768 rows, paper v2).
TRAIN_FILE = "hotpotqa_train_32k.parquet"
# The name the original's filter2.py gave the same file; read when TRAIN_FILE is absent.
ORIGINAL_TRAIN_FILE = "hotpotqa_train.parquet"
DEV_FILE = "hotpotqa_dev.parquet"


def data_root(given: str | Path | None = None, environ: Mapping[str, str] | None = None) -> tuple[Path, str]:
    """``(folder, what chose it)``: the given folder, else the environment's (see the module), else the
    repository's ``data/hotpotqa``. An empty variable counts as unset."""
    environ = os.environ if environ is None else environ
    if given:
        return Path(given).expanduser(), "the command line"
    for name in (DATA_DIR_ENV, "DATAROOT"):
        if environ.get(name):
            return Path(environ[name]).expanduser(), f"${name}"
    if environ.get("DATASET_ROOT"):
        return Path(environ["DATASET_ROOT"]).expanduser() / "hotpotqa", "$DATASET_ROOT/hotpotqa"
    return REPOSITORY / "data" / "hotpotqa", "the default"


def data_dir(given: str | Path | None = None) -> Path:
    """The folder of :func:`data_root`."""
    return data_root(given)[0]


def train_file(folder: Path) -> Path:
    """The training parquet in ``folder``: :data:`TRAIN_FILE`, or the original's name when only that is there."""
    if not (folder / TRAIN_FILE).exists() and (folder / ORIGINAL_TRAIN_FILE).exists():
        return folder / ORIGINAL_TRAIN_FILE
    return folder / TRAIN_FILE


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m taskutils.data_root", description=__doc__.split("\n\n")[0])
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--train", action="store_true", help="print the training parquet the launchers read")
    which.add_argument("--dev", action="store_true", help="print the validation parquet the launchers read")
    args = parser.parse_args(argv)
    folder, origin = data_root()
    folder = folder.resolve()
    if args.train:
        print(train_file(folder))
    elif args.dev:
        print(folder / DEV_FILE)
    else:
        print(f"{folder} ({origin})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
