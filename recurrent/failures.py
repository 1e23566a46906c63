"""A failed episode in one line: where in the agent's file it failed, and why.

Training's preflight runs one episode of the agent before the launch, and the trainer stops a step whose every
trajectory failed (verl_ext/agent_probe.py, verl_ext/failures.py); both say what went wrong the same way::

    my_agent.py:14: ZeroDivisionError: division by zero

The place is the deepest line of the agent's own file in the error's traceback (a call the trainer refused is
named at the agent's line that made it); a call left running when the agent returned is named at the line that made
it (the error's ``call_sites``); another error raised after the agent returned (no call, an answer that is not the
last reply) at the agent function's ``def`` line.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

MAX_CHARS = 600  # a message longer than this is cut: it is one line of a terminal


def source_file(source: Callable[..., Any] | None) -> str | None:
    """The file an agent's function was defined in (None when unknown)."""
    code = getattr(source, "__code__", None)
    return os.path.realpath(code.co_filename) if code is not None else None


def shown(path: str) -> str:
    """A path as its user reads it: relative to the working directory when under it."""
    try:
        return str(Path(path).relative_to(Path.cwd().resolve()))
    except ValueError:
        return path


def location(error: BaseException, source: Callable[..., Any] | None, at_def: bool = True) -> str | None:
    """``file:line`` of ``error`` in the agent's file: the deepest frame there (through the errors it was raised
    from), else (``at_def``) the function's ``def`` line; None without a source."""
    file = source_file(source)
    if file is None:
        return None
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        for site in getattr(current, "call_sites", ()):  # calls left running: where the agent made them
            lines = [line for name, line in site if os.path.realpath(name) == file]
            if lines:
                return f"{shown(file)}:{lines[0]}"
        frames = [f for f in traceback.extract_tb(current.__traceback__) if os.path.realpath(f.filename) == file]
        if frames:
            return f"{shown(file)}:{frames[-1].lineno}"
        current = current.__cause__ or current.__context__
    return f"{shown(file)}:{source.__code__.co_firstlineno}" if at_def else None  # type: ignore[union-attr]


def reason(error: BaseException) -> str:
    """The error's type and message on one line (an ``openai`` error's own message, not its HTTP body)."""
    body = getattr(error, "body", None)
    message = str(error)
    if isinstance(body, dict):
        inner = body.get("error") if isinstance(body.get("error"), dict) else body
        message = str(inner.get("message") or message)
    text = " ".join(f"{type(error).__name__}: {message}".split())
    return text if len(text) <= MAX_CHARS else text[: MAX_CHARS - 3] + "..."


def describe_failure(error: BaseException, source: Callable[..., Any] | None, at_def: bool = True) -> str:
    """``file:line: Type: message`` (``Type: message`` where the agent's file is unknown, or without ``at_def``
    where no line of it raised)."""
    where = location(error, source, at_def)
    return f"{where}: {reason(error)}" if where else reason(error)


def _installed(filename: str) -> bool:
    """Whether a traceback's file is Python's or an installed package's (or importlib's frozen code)."""
    if filename.startswith("<"):
        return True
    roots = {sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib", "purelib", "platlib")}
    path = os.path.realpath(filename)
    return any(path.startswith(os.path.realpath(root) + os.sep) for root in roots)


def import_site(error: BaseException) -> str | None:
    """``file:line`` where a module failed on import, through the errors it was raised from: a syntax error's own
    line, else the deepest line of the user's code (a helper module's misspelt import, a raise at module level),
    not Python's or an installed package's; None when there is none."""
    chain: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and all(current is not seen for seen in chain):
        chain.append(current)
        current = current.__cause__ or current.__context__
    for current in reversed(chain):  # the original error first
        if isinstance(current, SyntaxError) and current.filename and current.lineno:
            return f"{shown(os.path.realpath(current.filename))}:{current.lineno}"
        frames = [f for f in traceback.extract_tb(current.__traceback__) if not _installed(f.filename)]
        if frames:
            return f"{shown(os.path.realpath(frames[-1].filename))}:{frames[-1].lineno}"
    return None


def describe_import_failure(error: BaseException) -> str:
    """``file:line: Type: message`` of a module that failed on import, the original error's type and message."""
    original = error
    while original.__cause__ is not None:
        original = original.__cause__
    where = import_site(error)
    return f"{where}: {reason(original)}" if where else reason(original)


def thread_frame(thread: threading.Thread, skip: str = "") -> tuple[str, int, str] | None:
    """Where ``thread`` runs now, as (file, line, function): its innermost frame outside Python, the installed
    packages and the file ``skip`` (the agent's line, under a ``time.sleep`` or an ``Event.wait``); None when there
    is none."""
    frame = sys._current_frames().get(thread.ident or -1)
    while frame is not None:
        name = frame.f_code.co_filename
        file = os.path.realpath(name)
        if not _installed(name) and file != skip:
            return file, frame.f_lineno, frame.f_code.co_name
        frame = frame.f_back
    return None


def thread_position(thread: threading.Thread, skip: str = "") -> str | None:
    """:func:`thread_frame` as ``file:line (in function)``, the file as its user reads it."""
    found = thread_frame(thread, skip)
    return None if found is None else f"{shown(found[0])}:{found[1]} (in {found[2]})"
