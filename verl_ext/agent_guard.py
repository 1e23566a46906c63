"""The preflight's hold on the agent it tries out (verl_ext/preflight.py): whatever the agent file does at import
or in its trial episode, the preflight ends with one line and exit 2, never hangs, never exits 0 without "ready".

- Its first import runs in a thread of its own, within :data:`IMPORT_TIMEOUT_S`: a file that loops or sleeps at
  import is named at the line it was at, an exception injected into that thread, and the thread left (daemon).
  ``SystemExit`` raised there is a problem of the agent, not an exit of the preflight.
- While the agent is imported and tried, ``os._exit`` is refused (:func:`exits_refused`): an agent that calls it
  fails with its line, where the process would have ended with status 0 and no word. (An exit that bypasses
  ``os._exit``, through ``ctypes`` say, still ends the process: nothing in one process holds against it.)

The trial episode itself runs in the agent's own thread within its deadline (recurrent/agent_thread.py,
verl_ext/agent_probe.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import posix
import threading
import traceback
from collections.abc import Iterator
from typing import Any, NoReturn

from recurrent.agent_thread import AgentExitError, agent_position
from recurrent.failures import import_site, shown

IMPORT_TIMEOUT_S = 60.0  # an agent file imports in well under a second; one that imports torch, in seconds


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


class _ImportStopped(BaseException):
    """Injected into an import that did not finish in time."""


def import_problem(spec: str) -> str | None:
    """The one-line problem of the agent's first import when it does not finish within :data:`IMPORT_TIMEOUT_S`,
    or raises ``SystemExit``; None otherwise (its other errors are reported with the agent's other checks)."""
    from recurrent.interface import load_register

    outcome: dict[str, Any] = {}

    def load() -> None:
        try:
            load_register(spec)
        except (SystemExit, KeyboardInterrupt) as err:
            outcome["exit"] = err
        except ImportError as err:
            if isinstance(err.__cause__, AgentExitError):  # os._exit, refused
                outcome["refused"] = err.__cause__
        except BaseException:  # noqa: BLE001 (an ordinary import error: reported by the agent's other checks)
            pass

    thread = threading.Thread(target=load, name="recurrent-agent-import", daemon=True)
    thread.start()
    thread.join(IMPORT_TIMEOUT_S)
    if thread.is_alive():
        where = agent_position(thread)
        if thread.ident is not None:
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(_ImportStopped))
        at = f"; it was at {where}" if where else ""
        return (
            f"recurrent.agent={spec!r}: the agent file did not finish its import within {IMPORT_TIMEOUT_S:g} s (the "
            f"preflight's bound on an agent's import){at}"
        )
    refused = outcome.get("refused")
    if refused is not None:  # named at the agent's line, not at the refusal's
        frames = [f for f in traceback.extract_tb(refused.__traceback__) if os.path.realpath(f.filename) != _HERE]
        site = f"{shown(os.path.realpath(frames[-1].filename))}:{frames[-1].lineno}: " if frames else ""
        return f"recurrent.agent={spec!r}: {site}AgentExitError: {refused} (on import)"
    error = outcome.get("exit")
    if error is None:
        return None
    site = import_site(error)
    return (
        f"recurrent.agent={spec!r}: {site + ': ' if site else ''}{type(error).__name__}({error}) raised on import "
        "(sys.exit), which would end the preflight: an agent file defines its agent, it does not run"
    )
