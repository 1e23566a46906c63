"""Process checks shared by the test folders (a plain module beside the root conftest, imported by name)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def session_members(sid: int) -> list[int]:
    """Pids of live processes whose session id is ``sid``: what a launcher started in its own session."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[3]) == sid and fields[0] != "Z":  # fields: state ppid pgrp session ...
            members.append(int(entry))
    return members


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie, dead but not yet reaped, counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/status")
    return not (status.exists() and "zombie" in status.read_text())


def in_a_fresh_process(function: Callable[..., T], *args: Any) -> T:
    """``function(*args)`` run in a new interpreter (spawned, not forked), its result or its exception returned
    here. For tests that start a local Ray: Ray's native threads (gRPC, GCS client, event engine) outlive
    ``ray.shutdown()``, and a pytest process that still has them can crash at interpreter exit after every test
    passed. ``function`` must be importable by name (a module-level function of a test module)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(function, *args).result()


SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def load_script(name: str) -> Any:
    """A script of ``scripts/`` imported as a module (scripts are run by path, not installed)."""
    import importlib.util
    import sys

    path = SCRIPTS / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"scripts_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def run_in_folder_copy(
    folder: str, tmp_path: Path, *argv: str, timeout: float = 600, prepare: Callable[[Path], None] | None = None
) -> tuple[Path, Any]:
    """``python ARGV`` in a subprocess whose working directory is a temporary copy of the repository folder
    ``folder`` and nothing else (the original's ``cd taskutils/memory_eval && python run.py``); ``prepare`` may add
    files to the copy first. Returns the copy and the completed process (text output)."""
    import shutil
    import subprocess
    import sys

    copy = tmp_path / Path(folder).name
    shutil.copytree(Path(__file__).resolve().parents[1] / folder, copy, ignore=shutil.ignore_patterns("__pycache__"))
    if prepare is not None:
        prepare(copy)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, *argv], cwd=copy, env=env, capture_output=True, text=True, timeout=timeout)
    return copy, done
