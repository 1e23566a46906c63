"""The preflight's hold on the agent it tries out (verl_ext/preflight.py): whatever the agent file does at import
or in its trial episode, the preflight ends with one line and exit 2, never hangs, never exits 0 without "ready".

- Its first import is bounded as every entry point's is (recurrent/agent_import.py): a file that loops or sleeps at
  import is named at the line it was at; ``SystemExit`` raised there is a problem of the agent, not an exit of the
  preflight.
- While the agent is imported and tried, ``os._exit`` is refused (:func:`exits_refused`): an agent that calls it
  fails with its line, where the process would have ended with status 0 and no word. (An exit that bypasses
  ``os._exit``, through ``ctypes`` say, still ends the process: nothing in one process holds against it.)

The trial episode itself runs in the agent's own thread within its deadline (recurrent/agent_thread.py,
verl_ext/agent_probe.py).
"""

from __future__ import annotations

import contextlib
import os
import posix
import traceback
from collections.abc import Iterator
from typing import NoReturn

from recurrent.agent_import import AgentImportExitError, AgentImportTimeoutError
from recurrent.agent_thread import AgentExitError
from recurrent.failures import shown


@contextlib.contextmanager
def exits_refused() -> Iterator[None]:
    """``os._exit`` raises :class:`AgentExitError` in the block, in every thread (the agent's included)."""

    def refused(status: int) -> NoReturn:
        raise AgentExitError(f"the agent called os._exit({status}), which would end the preflight's process")

    saved = os._exit, posix._exit
    os._exit = posix._exit = refused  # type: ignore[assignment]
    try:
        yield
    finally:
        os._exit, posix._exit = saved  # type: ignore[assignment]


_HERE = os.path.realpath(__file__)


def import_problem(spec: str) -> str | None:
    """The one-line problem of the agent's first import when it does not finish within its bound
    (recurrent/agent_import.py), raises ``SystemExit`` or calls ``os._exit``; None otherwise (its other errors are
    reported with the agent's other checks)."""
    from recurrent.interface import load_register

    try:
        load_register(spec)
    except (AgentImportTimeoutError, AgentImportExitError) as err:
        return f"recurrent.agent={spec!r}: {err}"
    except ImportError as err:
        refused = err.__cause__
        if not isinstance(refused, AgentExitError):  # an ordinary import error: reported by the other checks
            return None
        # named at the agent's line, not at the refusal's
        frames = [f for f in traceback.extract_tb(refused.__traceback__) if os.path.realpath(f.filename) != _HERE]
        site = f"{shown(os.path.realpath(frames[-1].filename))}:{frames[-1].lineno}: " if frames else ""
        return f"recurrent.agent={spec!r}: {site}AgentExitError: {refused} (on import)"
    except Exception:  # noqa: BLE001 (reported by the agent's other checks)
        return None
    return None
