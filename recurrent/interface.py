"""The contracts of the multi-conversation workflow framework.

A *workflow* (the memory agent, a tool agent, ...) is written once, as a per-sample :class:`Session`: a small
state machine that says what the next model call is (:meth:`Session.next_turn`) and consumes its reply
(:meth:`Session.record`). Every turn is its own conversation (its own prompt and response), which becomes
its own training row. The managers drive sessions without knowing what they do:

- sync mode (:mod:`recurrent.lockstep`): all samples of a batch advance one turn at a time, in lockstep rounds,
  through any ``generate(i, turn) -> Reply`` coroutine (training: verl's token servers, via ``verl_ext``).
- async mode (:mod:`recurrent.async_manager`): one coroutine per sample against a :class:`ChatClient`
  (the ``openai`` async client for HTTP endpoints; verl's server manager in ``verl_ext``).

A :class:`Turn` carries the prompt both as chat ``messages`` (for OpenAI-style endpoints that apply the
chat template themselves) and, when the workflow can build it, as ``prompt_ids`` in token space (for
token-in backends: no decode and re-encode of long chunks).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

FinishReason = Literal["stop", "length"]


@dataclass
class WorkflowConfig:
    """Base of every workflow config (a dataclass; fields with defaults, so configs need only overrides)."""


@dataclass
class Turn:
    """One model call of a session: one conversation, one training row."""

    messages: list[dict[str, str]]  # the prompt as chat messages (user turn; system turn optional)
    max_tokens: int  # the cap on new tokens for this call
    prompt_ids: list[int] | None = None  # the same prompt in token space, chat template included, if built
    # Known in advance to be the session's last turn (the lockstep driver holds such turns back so that all
    # final turns form the last round). The reward always goes to a session's last turn, flagged or not.
    final: bool = False
    meta: dict[str, Any] = field(default_factory=dict)  # workflow-specific facts for traces (chunk index, ...)


@dataclass
class Reply:
    """What a model call returned."""

    text: str  # the generated text (special tokens skipped; a matched stop string appended: recurrent/client.py)
    finish_reason: FinishReason  # "length" when the call hit ``max_tokens``
    token_ids: list[int] | None = None  # generated ids, eos included if generated (token backends only)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0


@dataclass
class TurnRecord:
    """A finished turn: what was asked and what came back."""

    turn: Turn
    reply: Reply


class Session(ABC):
    """One sample's workflow: the single definition that sync and async modes both run."""

    @abstractmethod
    def next_turn(self) -> Turn | None:
        """The next model call, or ``None`` when the session is finished."""

    @abstractmethod
    def record(self, reply: Reply) -> None:
        """Consume the reply to the turn last returned by :meth:`next_turn`."""

    @property
    @abstractmethod
    def history(self) -> list[TurnRecord]:
        """Every finished turn, in order; the last one is final when the session is complete."""

    def trace(self) -> dict[str, Any]:
        """A JSON-serializable summary of this session for memory traces (override to add more)."""
        return {
            "turns": [
                {
                    **rec.turn.meta,
                    "final": rec.turn.final,
                    "response": rec.reply.text,
                    "finish_reason": rec.reply.finish_reason,
                    "prompt_tokens": rec.reply.prompt_tokens,
                    "completion_tokens": rec.reply.completion_tokens,
                    "seconds": round(rec.reply.seconds, 6),
                }
                for rec in self.history
            ]
        }


class ChatClient(Protocol):
    """An OpenAI-style chat endpoint: messages in, text out (async)."""

    async def chat(self, messages: list[dict[str, str]], max_tokens: int, **sampling: Any) -> Reply: ...


class Workflow(ABC):
    """A workflow implementation: built once per config and tokenizer, it makes one session per sample."""

    def __init__(self, config: WorkflowConfig, tokenizer: Any) -> None:
        self.config = config
        self.tokenizer = tokenizer

    @abstractmethod
    def session(self, sample: dict[str, Any]) -> Session:
        """The session of one sample (a row: a dict of columns). Missing columns raise a KeyError naming them."""


@dataclass(frozen=True)
class WorkflowRegistration:
    """What a workflow implementation exports as ``REGISTER``: its name, config class and workflow class."""

    name: str
    config_cls: type[WorkflowConfig]
    workflow_cls: type[Workflow]


def load_register(spec: str, obj_name: str = "REGISTER") -> WorkflowRegistration:
    """Load a workflow by dotted module path (``recurrent.impls.memory``, ``pkg.mod:OBJ``) or by file path
    (``path/to/impl.py`` or ``path/to/impl.py:OBJ``). Errors name the file, module or object at fault."""
    target, _, explicit = spec.partition(":")
    obj_name = explicit or obj_name
    if target.endswith(".py") or "/" in target:
        path = Path(target)
        if not path.is_file():
            raise FileNotFoundError(f"workflow file not found: {path}")
        module_spec = importlib.util.spec_from_file_location(f"recurrent_workflow_{path.stem}", path)
        if module_spec is None or module_spec.loader is None:
            raise ImportError(f"cannot import workflow file {path}")
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[module_spec.name] = module  # dataclasses resolve annotations through sys.modules
        module_spec.loader.exec_module(module)
        where = str(path)
    else:
        try:
            module = importlib.import_module(target)
        except ModuleNotFoundError as err:
            raise ModuleNotFoundError(f"workflow module {target!r} not found: {err}") from err
        where = target
    if not hasattr(module, obj_name):
        raise AttributeError(f"{where} has no object {obj_name!r}")
    register = getattr(module, obj_name)
    if not isinstance(register, WorkflowRegistration):
        raise TypeError(f"{where}:{obj_name} is a {type(register).__name__}, expected a WorkflowRegistration")
    return register
