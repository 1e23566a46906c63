"""The contract of the agent framework: what an agent is, what one model call is, how agents are registered.

An *agent* (the memory agent, a tool agent, ...) is one async function over a chat client (:mod:`recurrent.functions`):
``async def agent(sample, client, config) -> answer``, plain code that calls the model through an OpenAI-style
:class:`ChatClient` as often as it likes, with any control flow. It is written once, and then trains
(verl_ext),
evaluates (taskutils.memory_eval) and serves (taskutils.endpoint) through the same generic layers, in either rollout
mode: one coroutine per sample (:func:`recurrent.async_manager.run_session`), or lockstep rounds
(:mod:`recurrent.generation_manager`, the schedule of the paper's released training runs), where a barrier holds each
call until every agent of the batch is waiting on one.

One sample's run is an :class:`Episode`: every model call in order (a :class:`TurnRecord`), each call one training
row, the last call the answer that the reward scores. A call may be flagged ``final`` in advance (the memory
agent's answer): the lockstep barrier holds such calls until no agent has any other call left.

A :class:`Turn` carries the prompt both as chat ``messages`` (for OpenAI-style endpoints that apply the chat
template themselves) and, when the agent builds it, as ``prompt_ids`` in token space (for token-in backends: no
decode and re-encode of long chunks).
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import importlib.metadata
import importlib.util
import sys
import types
import typing
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, Protocol

from recurrent.agent_import import AgentImportExitError, AgentImportTimeoutError, exec_bounded
from recurrent.failures import describe_import_failure
from recurrent.step_shapes import StepShapesOf

FinishReason = Literal["stop", "length"]


@dataclass
class WorkflowConfig:
    """Base of every workflow config (a dataclass; fields with defaults, so configs need only overrides)."""


@dataclass
class Turn:
    """One model call of an episode: one conversation, one training row."""

    messages: list[dict[str, str]]  # the prompt as chat messages (user turn; system turn optional)
    max_tokens: int  # the cap on new tokens for this call
    prompt_ids: list[int] | None = None  # the same prompt in token space, chat template included, if built
    # Known in advance to be the episode's last call (the lockstep barrier holds such calls back so that all
    # final calls form the last round). The reward always goes to an episode's last call, flagged or not.
    final: bool = False
    meta: dict[str, Any] = field(default_factory=dict)  # workflow-specific facts for traces (chunk index, ...)
    # The sampling the agent asked for on this call (``temperature=...``), over the run's: in training the call is
    # sampled with it and its row records it (docs/write_your_own_agent.md, "Sampling of its own").
    sampling: dict[str, Any] = field(default_factory=dict)


@dataclass
class Reply:
    """What a model call returned."""

    text: str  # the generated text (special tokens skipped; a matched stop string appended: recurrent/client.py)
    finish_reason: FinishReason  # "length" when the call hit ``max_tokens``
    token_ids: list[int] | None = None  # generated ids, eos included if generated (token backends only)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    # Token backends (training): the exact prompt ids the backend received and its own output (verl's TokenOutput:
    # log-probs, weight versions), from which the call's training row is built.
    prompt_ids: list[int] | None = None
    backend_output: Any = None


@dataclass
class TurnRecord:
    """A finished turn: what was asked and what came back."""

    turn: Turn
    reply: Reply


class Episode(ABC):
    """One sample's run of an agent: its model calls in order. The last call is the answer (the reward's row)."""

    @property
    @abstractmethod
    def history(self) -> list[TurnRecord]:
        """Every finished model call, in order."""

    @property
    def finished(self) -> bool:
        """Whether the run has ended with its answer."""
        return bool(self.history)

    @abstractmethod
    async def run(
        self,
        client: ChatClient,
        sampling: dict[str, Any] | None = None,
        final_sampling: dict[str, Any] | None = None,
        on_turn: Callable[[Turn, Reply], None] | None = None,
    ) -> None:
        """Run the episode to its end against ``client``, calling ``on_turn`` after every model call.
        ``final_sampling`` is merged over ``sampling`` for calls flagged final (known in advance to be the answer)."""

    @property
    def answer(self) -> str | None:
        """The answer: the last call's reply, once finished."""
        return self.history[-1].reply.text if self.finished else None

    @property
    def score(self) -> float | None:
        """The agent's own score of its run, when it gave one (:class:`recurrent.functions.Answer`); a training
        reward function reads it (docs/write_your_own_agent.md, "A reward over the whole trajectory")."""
        return None

    def trace(self) -> dict[str, Any]:
        """A JSON-serializable summary of this run for traces (override to add more)."""
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


def stop_requested() -> bool:
    """Whether the current task has been asked to stop (a cancellation may be pending, not yet delivered: a client
    call that returned without awaiting again never raised it)."""
    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)  # Python 3.11+
    return bool(cancelling and cancelling())


def question_text(sample: dict[str, Any], key: str) -> str:
    """The question of a row: a plain string, or the content of the last user message of a chat list (verl's
    ``prompt`` column holds one)."""
    if key not in sample:
        raise KeyError(f"sample has no column {key!r} (the question); columns: {sorted(sample)}")
    value = sample[key]
    if isinstance(value, str):
        return value
    messages = list(value)
    users = [m for m in messages if m.get("role") == "user"]
    if not users:
        raise ValueError(f"column {key!r} holds a chat list without a user message: {messages!r}")
    return users[-1]["content"]


class ChatClient(Protocol):
    """An OpenAI-style chat endpoint: messages in, text out (async).

    ``prompt_ids``, when given, is the same prompt already in token space, chat template included: a token-in
    backend (training) sends it instead of templating ``messages``; an HTTP endpoint ignores it."""

    async def chat(
        self, messages: list[dict[str, str]], max_tokens: int, *, prompt_ids: list[int] | None = None, **sampling: Any
    ) -> Reply: ...


class TurnClient(Protocol):
    """A client that takes the whole :class:`Turn` of a call (its ``final`` flag and ``meta`` included): the
    lockstep barrier (recurrent/generation_manager.py) and drivers that script replies by turn. An agent's recording
    client (:class:`recurrent.functions.CallRecorder`) sends each call with :meth:`send_turn` where the client has it,
    else with ``chat``."""

    async def send_turn(self, turn: Turn, **sampling: Any) -> Reply: ...


@dataclass(frozen=True)
class RowWidths:
    """The longest prompt and the largest ``max_tokens`` of any model call of an agent, in tokens (chat template
    included), and the settings that make them, named in the error when they do not fit a trainer's rows."""

    prompt: int
    response: int
    made_of: str  # e.g. "template 213 + question max_prompt_length=64 + chunk chunk_size=64 + memory 32"


class Workflow(ABC):
    """An agent, built once per config and tokenizer: it makes one :class:`Episode` per sample.

    Besides :meth:`episode`, an agent may say the widest call it can make (checked against a trainer's row widths);
    the columns it reads are declared with its registration (:class:`WorkflowRegistration`), so that they can be
    checked before any tokenizer is loaded."""

    def __init__(self, config: WorkflowConfig, tokenizer: Any) -> None:
        self.config = config
        self.tokenizer = tokenizer

    @abstractmethod
    def episode(self, sample: dict[str, Any]) -> Episode:
        """The episode of one sample (a row: a dict of columns). Missing columns raise a KeyError naming them. May
        be expensive (a long document is tokenized here): callers with an event loop run it in a worker thread."""

    def row_widths(self) -> RowWidths | None:
        """The widest model call this agent can make, or None when it cannot say (calls are then checked one by
        one, as they are made)."""
        return None


Columns = tuple[str, ...] | Callable[[Any], tuple[str, ...]]  # fixed, or read from the agent's config


def field_types(config_cls: type) -> dict[str, Any]:
    """The type of each field of an agent's config class ({} when its annotations cannot be resolved: the class's
    own checks still run)."""
    try:
        return typing.get_type_hints(config_cls)
    except (NameError, TypeError):
        return {}


def fits_type(value: Any, hint: Any) -> bool:
    """Whether a value is of a config field's type: the plain types (a bool is no int nor float), their unions and
    literals; any other type is left to the config class's own checks."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(fits_type(value, arg) for arg in typing.get_args(hint))
    if origin is typing.Literal:
        return value in typing.get_args(hint)
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    return True


def type_name(hint: Any) -> str:
    """A field's type as an error message names it (``int``, ``str | None``)."""
    if typing.get_origin(hint) is not None or not hasattr(hint, "__name__"):
        return str(hint).replace("typing.", "")
    return hint.__name__


@dataclass(frozen=True)
class WorkflowRegistration:
    """What an agent's module exports as ``REGISTER``: its name, its config class, how it is built, what it reads.

    ``build(config, tokenizer)`` makes the agent for training (prompts in token space where it can build them);
    ``inference(tokenizer, **options)``, where given, makes it for evaluation and serving behind an OpenAI-style
    endpoint (the memory agent's paper settings: recurrent/impls/memory.py); without it, inference builds the
    agent from ``config_cls(**options)`` like training does. ``columns``: what every sample must hold (a trainer
    checks its data files for them); ``large_columns``: its documents, text too large to copy into every training row
    (the endpoint reads one as a request's document; the trainer's preflight checks that the data hold text there)."""

    name: str
    config_cls: type[WorkflowConfig]
    build: Callable[[WorkflowConfig, Any], Workflow]
    inference: Callable[..., Workflow] | None = None
    columns: Columns = ()
    large_columns: Columns = ()
    # How many model calls one sample makes, from facts about it (keywords; the memory agent reads
    # context_tokens, a document's length): what a step plan counts rows with (verl_ext/plan.py). None:
    # unknown.
    calls_per_sample: Callable[..., int] | None = None
    # Whether building it for inference needs the model's tokenizer (it counts tokens: chunks, truncation). The
    # endpoint loads one only for an agent that does (docs/serving.md); agent functions default to False.
    needs_tokenizer: bool = True
    # What a training step's calls cost in tokens: step_shapes(config, tokenizer or None, StepShapesRequest) ->
    # StepShapes, the calls of each prompt's trajectory (recurrent/step_shapes.py); the step cost model counts
    # with them (verl_ext/cost.py). None: the agent has no cost model.
    step_shapes: StepShapesOf | None = None
    # The agent's own function (an agent function's, or an ``openai``-client agent's): its file and line name the
    # agent in the messages of a failed episode (recurrent/failures.py). None: the registration's module.
    source: Callable[..., Any] | None = None

    def columns_of(self, config: WorkflowConfig) -> tuple[str, ...]:
        return tuple(self.columns(config) if callable(self.columns) else self.columns)

    def large_columns_of(self, config: WorkflowConfig) -> tuple[str, ...]:
        return tuple(self.large_columns(config) if callable(self.large_columns) else self.large_columns)

    def make_config(self, values: Mapping[str, Any] | None = None) -> WorkflowConfig:
        """The agent's config from a mapping (a config section), unknown keys and values of the wrong type named in
        the error (``max_turns: true`` is no 1: a bool is no int)."""
        values = dict(values or {})
        known = {f.name for f in fields(self.config_cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(
                f"agent {self.name!r} ({self.config_cls.__name__}) has no setting {', '.join(map(repr, unknown))}; "
                f"its settings: {', '.join(sorted(known)) or 'none'}"
            )
        hints = field_types(self.config_cls)
        wrong = [
            f"{key}: {value!r} is not of type {type_name(hints[key])}"
            for key, value in values.items()
            if key in hints and not fits_type(value, hints[key])
        ]
        if wrong:
            raise ValueError(f"agent {self.name!r} ({self.config_cls.__name__}): {'; '.join(wrong)}")
        return self.config_cls(**values)

    def for_training(self, values: Mapping[str, Any] | None, tokenizer: Any) -> Workflow:
        return self.build(self.make_config(values), tokenizer)

    def for_inference(self, tokenizer: Any, **options: Any) -> Workflow:
        if self.inference is not None:
            return self.inference(tokenizer, **options)
        return self.build(self.make_config(options), tokenizer)


AGENT_ENTRY_POINTS = "recurrent.agents"  # the registered names: entry points of this group (pyproject.toml)


@functools.cache
def _agent_entry_points(search_path: tuple[str, ...]) -> dict[str, str]:
    """name -> ``module:OBJECT`` of the ``recurrent.agents`` entry points found on ``search_path`` (the first of a
    name wins, as Python's import does). Read once per ``sys.path``: a scan opens every installed package's
    metadata (~40 ms here), and a data build resolves an agent by name for each of thousands of transcripts."""
    found: dict[str, str] = {}
    for entry in importlib.metadata.entry_points(group=AGENT_ENTRY_POINTS):
        found.setdefault(entry.name, entry.value)
    return found


def registered_agents() -> list[str]:
    """The registered agent names: the ``recurrent.agents`` entry points of every installed package (this one
    registers ``memory``, ``direct`` and ``calculator``; a user's package registers its own with one line)."""
    return sorted(_agent_entry_points(tuple(sys.path)))


def registered_spec(name: str) -> str | None:
    """The ``module:OBJECT`` a registered name stands for, or None."""
    return _agent_entry_points(tuple(sys.path)).get(name)


def is_agent_file(spec: str) -> bool:
    """Whether an agent spec names a file (``path/to/agent.py``, ``agent.py:OBJ``) rather than a registered name or
    a dotted module: the rule :func:`load_register` applies, for callers that resolve or name such files first."""
    target = spec.partition(":")[0]
    return target.endswith(".py") or "/" in target


def load_register(spec: str, obj_name: str = "REGISTER") -> WorkflowRegistration:
    """Load an agent by registered name (``memory``: the entry point ``recurrent.impls.memory:REGISTER``), by dotted
    module path (``pkg.mod``, ``pkg.mod:OBJ``) or by file path (``path/to/agent.py`` or ``path/to/agent.py:OBJ``).
    A file's folder is put first on ``sys.path`` before it runs, as Python does for a script, so that it imports
    the modules beside it. Errors name the file, module or object at fault, and for an unknown name the registered
    ones."""
    target, _, explicit = spec.partition(":")
    obj_name = explicit or obj_name
    if is_agent_file(spec):
        path = Path(target)
        if not path.is_file():
            raise FileNotFoundError(f"agent file not found: {path}")
        module_spec = importlib.util.spec_from_file_location(f"recurrent_agent_{path.stem}", path)
        if module_spec is None or module_spec.loader is None:
            raise ImportError(f"cannot import agent file {path}")
        folder = str(path.resolve().parent)
        if folder not in sys.path:  # its helper modules import as they do when the file runs as a script
            sys.path.insert(0, folder)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[module_spec.name] = module  # dataclasses resolve annotations through sys.modules
        try:
            exec_bounded(module_spec.loader, module, path)  # a file that loops or exits at import: named
        except (AgentImportTimeoutError, AgentImportExitError):
            raise
        except Exception as err:  # the file's own fault (a syntax error, a helper's misspelt import): its line
            raise ImportError(f"{describe_import_failure(err)} (agent file {path} failed on import)") from err
        where = str(path)
    else:
        name = target
        if "." not in target:
            registered = registered_spec(target)
            if registered is None:
                known = ", ".join(registered_agents())
                raise ModuleNotFoundError(f"no agent {target!r}: not a registered agent name ({known})")
            name, _, registered_obj = registered.partition(":")
            obj_name = explicit or registered_obj or obj_name
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as err:
            if err.name != name and not name.startswith(f"{err.name}."):  # one of the module's own imports
                raise ImportError(f"{describe_import_failure(err)} (agent module {name} failed on import)") from err
            known = ", ".join(registered_agents())
            raise ModuleNotFoundError(
                f"no agent {target!r}: not a registered agent name ({known}) nor an importable module ({err})"
            ) from err
        except Exception as err:  # a syntax error, a raise at import
            raise ImportError(f"{describe_import_failure(err)} (agent module {name} failed on import)") from err
        where = name
    if not hasattr(module, obj_name):
        raise AttributeError(f"{where} has no object {obj_name!r}")
    register = getattr(module, obj_name)
    if not isinstance(register, WorkflowRegistration):
        raise TypeError(f"{where}:{obj_name} is a {type(register).__name__}, expected a WorkflowRegistration")
    return register
