"""The original's commands where its users type them: ``cd taskutils/memory_eval && python run.py ...`` (and
``cd taskutils/memory_data && python run.py STAGE ...``) run the package's module, as ``python -m`` runs it.

Run as a file, a script's folder is ``sys.path[0]``: there this folder's modules (``config.py``, ``results.py``,
``tokenizer.py``, ...) would shadow any module of the same name that a library imports. The folder leaves
``sys.path`` (the repository root, which the file put first to import this module, stays), and the module runs as
``__main__``, its ``if __name__ == "__main__"`` block included.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path
from typing import NoReturn


def run_as_module(file: str, module: str) -> NoReturn:
    """Run ``module`` as ``python -m module`` would, with the folder of ``file`` off ``sys.path``."""
    folder = Path(file).resolve().parent
    sys.path[:] = [entry for entry in sys.path if Path(entry or ".").resolve() != folder]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
    sys.exit(0)  # the module's own sys.exit ends the run first; a module without one has finished
