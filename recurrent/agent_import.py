"""An agent file's import, bounded: its module code runs in a thread of its own, so that a file that loops or
sleeps at import is named at the line it was at within :data:`IMPORT_TIMEOUT_S`, in every entry point that loads
it (the harness, the endpoint, the quickstart, the preflight, training's workers: recurrent.interface.load_register).
``sys.exit`` at import is the file's fault, not an exit of the command that loads it. The stuck thread is left, as
a daemon: nothing is injected into it (an exception raised at an arbitrary point of an import, in the middle of
compiling a class, can leave the interpreter's compiler in a bad state), and every command that loads an agent stops
on the error (docs/architecture.md, "Where an agent's code runs").
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from recurrent.failures import import_site, thread_position

IMPORT_TIMEOUT_S = 60.0  # an agent file imports in well under a second; one that imports torch, in seconds


_HERE = os.path.realpath(__file__)


class AgentImportTimeoutError(ImportError):
    """An agent file whose import did not finish within :data:`IMPORT_TIMEOUT_S`."""


class AgentImportExitError(ImportError):
    """An agent file that raised ``SystemExit`` (or ``KeyboardInterrupt``) at import."""


def exec_bounded(loader: Any, module: Any, path: Path) -> None:
    """``loader.exec_module(module)`` in a thread of its own, within :data:`IMPORT_TIMEOUT_S`; what it raises is
    raised here (its traceback kept), ``SystemExit`` as :class:`AgentImportExitError`."""
    outcome: dict[str, BaseException] = {}

    def run() -> None:
        try:
            loader.exec_module(module)
        except BaseException as err:  # noqa: BLE001 (raised again in the caller's thread)
            outcome["error"] = err

    thread = threading.Thread(target=run, name=f"agent-import-{path.name}", daemon=True)
    thread.start()
    thread.join(IMPORT_TIMEOUT_S)
    if thread.is_alive():  # left as it is: every command that loads an agent stops on this error
        where = thread_position(thread, skip=_HERE)
        at = f"; it was at {where}" if where else ""
        raise AgentImportTimeoutError(
            f"the agent file did not finish its import within {IMPORT_TIMEOUT_S:g} s (the bound on an agent file's "
            f"import){at}"
        )
    error = outcome.get("error")
    if isinstance(error, SystemExit | KeyboardInterrupt):
        site = import_site(error)
        raise AgentImportExitError(
            f"{site + ': ' if site else ''}{type(error).__name__}({error}) raised on import (sys.exit), which would "
            f"end the command that loads it: an agent file defines its agent, it does not run (agent file {path})"
        ) from error
    if error is not None:
        raise error
