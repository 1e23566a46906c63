"""Agents that block their own thread in plain code (issue 63), for the deadline tests of the harness, the
endpoint and training: an agent file imports these events, and waits on ``RELEASE`` without awaiting (its thread
stops, not an event loop), after setting ``BLOCKED``. A test clears both first (:func:`reset`), asserts on what
was recorded while the agent is still blocked, and releases it at its end (the abandoned thread then ends). No
test waits on a clock: the deadlines are what ends the episodes."""

from __future__ import annotations

import threading

BLOCKED = threading.Event()  # set by the agent once it blocks
RELEASE = threading.Event()  # set by the test at its end


def reset() -> None:
    BLOCKED.clear()
    RELEASE.clear()


def agent_file(after_one_call: str, columns: tuple[str, ...] = ("input",), column: str = "input") -> str:
    """An agent file whose agent makes one model call, then runs ``after_one_call`` (lines indented 4), then
    answers with the reply. Its blocking line is the one marked ``# blocks``."""
    return f"""
import os
import sys
import time
from dataclasses import dataclass

from blocking_agents import BLOCKED, RELEASE
from recurrent.functions import agent_function
from recurrent.interface import WorkflowConfig


@dataclass
class BlockConfig(WorkflowConfig):
    max_tokens: int = 8


async def block(sample, client, config):
    reply = await client.chat([{{"role": "user", "content": sample[{column!r}]}}], config.max_tokens)
{after_one_call}    return reply.text


REGISTER = agent_function("block", BlockConfig, block, columns={columns!r})
"""


BLOCK = "    BLOCKED.set()\n    RELEASE.wait()  # blocks\n"  # its thread waits in plain code, never awaiting
SPIN = "    BLOCKED.set()\n    while not RELEASE.is_set():  # blocks\n        pass\n"  # computes without awaiting
EXIT = "    sys.exit(0)  # blocks\n"


def marked_line(text: str, marker: str = "# blocks") -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if marker in line)
