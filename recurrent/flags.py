"""Command lines built from settings dataclasses: a field declares its flag once (help, type, default), a parser gets
the flags of a dataclass, and the parsed flags give the dataclass back.

    @dataclass(frozen=True)
    class Budgets:
        chunk_size: int = flag(5000, "document tokens per chunk (default %(default)s)", type=positive_int)

    add_flags(parser.add_argument_group("budgets"), Budgets)  # --chunk-size
    budgets = from_args(Budgets, parser.parse_args())

A field's flag is its name with dashes (``chunk_size``: ``--chunk-size``) and its value lands under the field's name,
so a ``--config`` option file (keys as the long flags, :mod:`recurrent.options`) reads it as any other flag. A help
text says ``%(default)s`` where it shows the default, so the default is written once, in the field.

The options every command that talks to a model server shares are declared here, once: :class:`ClientOptions` (how
the chat client waits and retries) and :class:`SamplingOptions` (the paper's sampling), used by the evaluation
harness (``python -m taskutils.memory_eval.run``), the endpoint (``python -m taskutils.endpoint``) and
``quickstart.py``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any, TypeVar

from recurrent.options import non_negative_int, positive_seconds, seconds
from recurrent.sampling import argument as sampling_argument

FLAG = "flag"  # the metadata key of a field's flag
T = TypeVar("T")


@dataclass(frozen=True)
class Flag:
    """How a field is given on the command line; ``type`` converts and checks the text (argparse's ``type``); a
    ``help`` that is a function is called when the parser is built (a list of what is registered then)."""

    help: str | Callable[[], str]
    type: Callable[[str], Any] | None = None
    choices: tuple[Any, ...] | None = None
    metavar: str | tuple[str, ...] | None = None
    nargs: int | str | None = None
    action: str | None = None  # "append": a flag given several times
    positional: bool = False  # an argument without a dash (its name, the field's)
    aliases: tuple[str, ...] = ()  # other spellings of the flag (the original's, e.g. --max_new)


def flag(
    default: Any = MISSING,
    help: str | Callable[[], str] = "",
    *,
    factory: Any = MISSING,
    type: Callable[[str], Any] | None = None,
    choices: Iterable[Any] | None = None,
    metavar: str | tuple[str, ...] | None = None,
    nargs: int | str | None = None,
    action: str | None = None,
    positional: bool = False,
    aliases: Iterable[str] = (),
) -> Any:
    """A dataclass field with its flag: ``default`` (or ``factory``, called when the parser is built, for a list or
    an environment variable's value), the flag's help and argparse's ``type``, ``choices``, ``metavar``, ``nargs``,
    ``action``, other spellings (``aliases``). A field whose default is False and that has no type is a switch
    (``store_true``)."""
    choices = tuple(choices) if choices is not None else None
    spec = Flag(help, type, choices, metavar, nargs, action, positional, tuple(aliases))
    return field(default=default, default_factory=factory, metadata={FLAG: spec})


def flag_fields(cls: type, only: Iterable[str] | None = None, skip: Iterable[str] = ()) -> list[Field]:
    """The fields of ``cls`` that have a flag, in declaration order (``only``: these names; ``skip``: not these)."""
    declared = [f for f in fields(cls) if FLAG in f.metadata]
    names = {f.name for f in declared}
    asked = set(only or ()) | set(skip)
    if asked - names:
        raise ValueError(f"{cls.__name__} has no flag field(s) {sorted(asked - names)}")
    skipped = set(skip)
    return [f for f in declared if (only is None or f.name in only) and f.name not in skipped]


def option_string(field_: Field) -> str:
    """The flag of a field: ``--`` and its name with dashes."""
    return "--" + field_.name.replace("_", "-")


def field_default(field_: Field) -> Any:
    """A field's default as its flag's: its value, or its factory's (called now), or None for a required field."""
    if field_.default is not MISSING:
        return field_.default
    if field_.default_factory is not MISSING:
        return field_.default_factory()
    return None


def add_flags(
    target: argparse.ArgumentParser | argparse._ArgumentGroup,
    cls: type,
    *,
    only: Iterable[str] | None = None,
    skip: Iterable[str] = (),
) -> None:
    """Add a flag for each field of the dataclass ``cls`` that declares one (see :func:`flag`) to a parser or an
    argument group; its value is stored under the field's name."""
    for field_ in flag_fields(cls, only, skip):
        spec: Flag = field_.metadata[FLAG]
        default = field_default(field_)
        options: dict[str, Any] = {"help": spec.help() if callable(spec.help) else spec.help}
        if default is False and spec.type is None and spec.action is None:
            options["action"] = "store_true"
        else:
            given = {"type": spec.type, "choices": spec.choices, "metavar": spec.metavar, "nargs": spec.nargs}
            options.update({key: value for key, value in given.items() if value is not None})
            if spec.action is not None:
                options["action"] = spec.action
        if spec.positional:
            target.add_argument(field_.name, **options)
        else:
            target.add_argument(option_string(field_), dest=field_.name, default=default, **options)
            for alias in spec.aliases:  # its own hidden flag: help and errors name the flag as documented
                hidden = {**options, "help": argparse.SUPPRESS}
                target.add_argument(alias, dest=field_.name, default=argparse.SUPPRESS, **hidden)


def from_args(cls: type[T], args: argparse.Namespace, **changes: Any) -> T:
    """The dataclass ``cls`` of parsed flags: each field with a flag from its value in ``args`` (a field whose flag
    the parser did not have keeps its default), ``changes`` over them."""
    values = {f.name: getattr(args, f.name) for f in flag_fields(cls) if hasattr(args, f.name)}
    return cls(**{**values, **changes})


@dataclass(frozen=True)
class ClientOptions:
    """How a command's chat client (:class:`recurrent.client.OpenAIChatClient`, whose arguments these are) waits for
    a model server and retries it. One definition and one default each for every command: the harness's many items
    and the endpoint's documents and the quickstart's one run face the same servers, a GPU's vLLM or a CPU's
    ``transformers serve``, so an attempt's time grows with its tokens rather than with the command."""

    timeout: float = flag(
        300.0,
        "seconds per request attempt, plus --timeout-per-token for every prompt and new token; a finite number > 0 "
        "(default %(default)s)",
        type=positive_seconds,
    )
    timeout_per_token: float = flag(
        0.1,
        "seconds added to an attempt's timeout per token of its prompt (estimated) and of its max_tokens; a finite "
        "number >= 0 (default %(default)s: a 5000-token chunk with a 1024-token memory gets ~15 minutes)",
        type=seconds,
    )
    max_retries: int = flag(
        3,
        "retries of a failed request (connection errors, timeouts, 429, 5xx); an integer >= 0 (default %(default)s)",
        type=non_negative_int,
    )
    backoff: float = flag(
        1.0,
        "seconds before the first retry, doubling with each (at most 60); a finite number >= 0 (default %(default)s)",
        type=seconds,
    )


@dataclass(frozen=True)
class SamplingOptions:
    """The sampling of a command's requests: the paper's (docs/fidelity.md), checked by the rules of
    :mod:`recurrent.sampling`."""

    temperature: float = flag(0.7, "sampling temperature (paper: %(default)s)", type=sampling_argument("temperature"))
    top_p: float = flag(0.95, "nucleus sampling (paper: %(default)s)", type=sampling_argument("top_p"))
