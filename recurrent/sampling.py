"""Sampling values, one rule each, checked where they enter: the endpoint's requests (HTTP 400 naming the field),
the harness's and the quickstart's flags and option files, the trainer's config preflight (exit 2 before any
work). A value out of its range would otherwise reach the model server, which answers with an error that blames
the upstream (a 500 retried, then a 502), or is accepted and samples nonsense. NaN and infinities are refused
everywhere; a bool is not a number. The ranges are those vLLM's ``SamplingParams`` accepts (docs/serving.md,
"Sampling values").
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

INT64 = (-(2**63), 2**63 - 1)


class SamplingError(ValueError):
    """A sampling value out of its rule; ``field`` names it as the caller knows it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field} {message}")
        self.field = field


@dataclass(frozen=True)
class Rule:
    """A number's type and range: ``low``/``high`` inclusive unless ``low_open`` (the low end excluded)."""

    integer: bool = False
    low: float | None = None
    high: float | None = None
    low_open: bool = False

    def describe(self) -> str:
        kind = "an integer" if self.integer else "a finite number"
        if self.low is not None and self.high is not None:
            opening = "(" if self.low_open else "["
            return f"{kind} in {opening}{_show(self.low)}, {_show(self.high)}]"
        if self.low is not None:
            return f"{kind} {'>' if self.low_open else '>='} {_show(self.low)}"
        return kind

    def admits(self, value: Any) -> bool:
        if isinstance(value, bool) or not isinstance(value, int if self.integer else (int, float)):
            return False
        if not self.integer and not math.isfinite(value):
            return False
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or value <= self.high


def _show(bound: float) -> str:
    return str(int(bound)) if float(bound).is_integer() and abs(bound) < 1e15 else str(bound)


# The rule of every sampling value the project passes on (vLLM's checks in SamplingParams._verify_args).
RULES: dict[str, Rule] = {
    "temperature": Rule(low=0.0),
    "top_p": Rule(low=0.0, high=1.0, low_open=True),
    "top_k": Rule(integer=True, low=-1),  # -1 and 0: no top-k
    "min_p": Rule(low=0.0, high=1.0),
    "presence_penalty": Rule(low=-2.0, high=2.0),
    "frequency_penalty": Rule(low=-2.0, high=2.0),
    "repetition_penalty": Rule(low=0.0, low_open=True),
    "seed": Rule(integer=True, low=INT64[0], high=INT64[1]),
    "max_tokens": Rule(integer=True, low=1),
    "n": Rule(integer=True, low=1),
}


# The sampling a call may set for itself (docs/write_your_own_agent.md, "Sampling of its own"), and what the one of
# them a call leaves unset is then: the model's own distribution (OpenAI's API defaults too). A call that sets
# neither samples with its run's values (the paper's evaluation or training settings, which differ on purpose).
CALL_FIELDS = ("temperature", "top_p")
MODEL_DISTRIBUTION = {"temperature": 1.0, "top_p": 1.0}


def own_sampling(own: Mapping[str, Any]) -> dict[str, Any]:
    """A call's own sampling made whole by the one rule of every entry point (the harness, the endpoint, the local
    server, the quickstart, training): a call that sets ``temperature`` or ``top_p`` gets 1.0 for the other of the
    two, never the run's value of it; a call that sets neither is returned as it is (the run's apply). A value of
    None is unset."""
    own = {name: value for name, value in own.items() if value is not None}  # None: unset
    if any(name in own for name in CALL_FIELDS):
        own = {**MODEL_DISTRIBUTION, **own}
    return own


def call_sampling(run: Mapping[str, Any], own: Mapping[str, Any]) -> dict[str, Any]:
    """What one call samples with: the run's values under the call's own, made whole by :func:`own_sampling`."""
    return {**{k: v for k, v in run.items() if v is not None}, **own_sampling(own)}


def describe_rule(run: Mapping[str, Any], whose: str) -> str:
    """The one line a run prints of its sampling: its values, whose they are, and what a call setting one gets."""
    shown = {name: run.get(name) for name in CALL_FIELDS if run.get(name) is not None}
    values = ", ".join(f"{name} {_show(v) if isinstance(v, int | float) else v}" for name, v in shown.items())
    return (
        f"sampling: {values} ({whose}) for calls that set neither temperature nor top_p; a call that sets one "
        "gets 1.0 for the other (docs/write_your_own_agent.md, 'Sampling of its own')"
    )


def check_value(name: str, value: Any, field: str | None = None) -> Any:
    """``value`` when it obeys the rule of ``name``; :class:`SamplingError` naming ``field`` (default ``name``)."""
    rule = RULES[name]
    if not rule.admits(value):
        raise SamplingError(field or name, f"must be {rule.describe()}, got {value!r}")
    return value


def check_sampling(values: Mapping[str, Any]) -> dict[str, Any]:
    """The values of ``values`` that have a rule, checked (``None`` means unset and is dropped); other keys are the
    caller's business."""
    return {name: check_value(name, value) for name, value in values.items() if name in RULES and value is not None}


def check_stop(value: Any, field: str = "stop") -> list[str]:
    """A stop value as a list of strings: a string, a list of strings, or None (no stop)."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise SamplingError(field, f"must be a string or a list of strings, got {value!r}")
    return list(value)


def argument(name: str) -> Callable[[str], Any]:
    """An argparse ``type`` for the flag of ``name``: a bad value stops with a usage error (exit 2) naming the flag,
    before anything starts."""
    rule = RULES[name]

    def parse(text: str) -> Any:
        try:
            value = int(text) if rule.integer else float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {rule.describe()}, got {text!r}") from None
        if not rule.admits(value):
            raise argparse.ArgumentTypeError(f"must be {rule.describe()}, got {text}")
        return value

    parse.__name__ = name  # argparse names the type in its messages
    return parse
