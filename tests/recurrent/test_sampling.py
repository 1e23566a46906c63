"""The sampling rules (recurrent/sampling.py), each range edge by hand: the ranges vLLM's ``SamplingParams``
accepts (docs/serving.md, "Sampling values"); NaN, infinities and bools refused everywhere."""

from __future__ import annotations

import argparse
import math

import pytest

from recurrent.sampling import INT64, RULES, SamplingError, argument, check_sampling, check_stop, check_value

# (rule, accepted at or inside the edges, refused just outside them)
EDGES = {
    "temperature": ([0, 0.0, 1e-9, 2.0, 1e6], [-1e-9, -1]),
    "top_p": ([1e-9, 0.5, 1, 1.0], [0, 0.0, -0.1, 1.0000001, 2]),  # (0, 1]: vLLM refuses 0
    "top_k": ([-1, 0, 1, 50], [-2]),  # -1 and 0: no top-k
    "min_p": ([0, 0.0, 1, 1.0], [-1e-9, 1.0000001]),
    "presence_penalty": ([-2, -2.0, 0, 2.0], [-2.0000001, 2.0000001]),
    "frequency_penalty": ([-2.0, 2, 2.0], [-2.1, 2.1]),
    "repetition_penalty": ([1e-9, 1, 5.0], [0, 0.0, -1]),  # (0, inf)
    "seed": ([INT64[0], 0, INT64[1]], [INT64[0] - 1, INT64[1] + 1]),
    "max_tokens": ([1, 2**40], [0, -1]),
    "n": ([1, 16], [0, -2]),
}


def test_every_rule_has_its_edges_here():
    assert set(EDGES) == set(RULES)


@pytest.mark.parametrize("name", sorted(EDGES))
def test_each_range_edge(name):
    accepted, refused = EDGES[name]
    for value in accepted:
        assert check_value(name, value) == value
    for value in refused:
        with pytest.raises(SamplingError) as err:
            check_value(name, value)
        assert str(err.value) == f"{name} must be {RULES[name].describe()}, got {value!r}"


@pytest.mark.parametrize("name", sorted(EDGES))
def test_nan_infinities_bools_strings_and_none_are_refused(name):
    for value in (math.nan, math.inf, -math.inf, True, False, "1", None, [1]):
        with pytest.raises(SamplingError):
            check_value(name, value)


def test_an_integer_rule_refuses_a_float_even_a_whole_one():
    for name in ("top_k", "seed", "max_tokens", "n"):
        with pytest.raises(SamplingError, match="must be an integer"):
            check_value(name, 1.0)


def test_the_field_named_is_the_callers():
    with pytest.raises(SamplingError) as err:
        check_value("n", 0, "actor_rollout_ref.rollout.n")
    assert err.value.field == "actor_rollout_ref.rollout.n"
    assert str(err.value) == "actor_rollout_ref.rollout.n must be an integer >= 1, got 0"


def test_the_descriptions_show_open_and_closed_ends():
    assert RULES["top_p"].describe() == "a finite number in (0, 1]"
    assert RULES["min_p"].describe() == "a finite number in [0, 1]"
    assert RULES["repetition_penalty"].describe() == "a finite number > 0"
    assert RULES["temperature"].describe() == "a finite number >= 0"
    assert RULES["n"].describe() == "an integer >= 1"


def test_check_sampling_drops_none_and_leaves_other_keys_to_the_caller():
    assert check_sampling({"temperature": 0, "top_p": None, "logprobs": 5}) == {"temperature": 0}
    with pytest.raises(SamplingError, match="top_p"):
        check_sampling({"top_p": 0})


def test_check_stop():
    assert check_stop(None) == [] and check_stop("x") == ["x"] and check_stop(["a", "b"]) == ["a", "b"]
    for bad in (1, ["a", 1], {"a": 1}):
        with pytest.raises(SamplingError, match="stop must be a string or a list of strings"):
            check_stop(bad)


def test_the_argparse_type_parses_then_applies_the_rule():
    assert argument("top_p")("1") == 1.0 and argument("seed")("-5") == -5
    for name, text in (("top_p", "0"), ("temperature", "nan"), ("temperature", "inf"), ("n", "1.5"), ("n", "x")):
        with pytest.raises(argparse.ArgumentTypeError, match="must be"):
            argument(name)(text)


def test_one_rule_makes_a_calls_own_sampling_whole():
    from recurrent.sampling import call_sampling, own_sampling

    run = {"temperature": 0.7, "top_p": 0.95, "seed": 3}
    # sets neither: the run's for both (the paper's memory agent)
    assert call_sampling(run, {}) == {"temperature": 0.7, "top_p": 0.95, "seed": 3}
    assert call_sampling(run, {"top_k": 5}) == {"temperature": 0.7, "top_p": 0.95, "seed": 3, "top_k": 5}
    # sets one: 1.0 for the other, never the run's
    assert call_sampling(run, {"temperature": 0.2}) == {"temperature": 0.2, "top_p": 1.0, "seed": 3}
    assert call_sampling(run, {"top_p": 0.5}) == {"temperature": 1.0, "top_p": 0.5, "seed": 3}
    # sets both: its own; None counts as unset
    assert call_sampling(run, {"temperature": 1.2, "top_p": 0.9}) == {"temperature": 1.2, "top_p": 0.9, "seed": 3}
    assert own_sampling({"temperature": None}) == {} and call_sampling(run, {"top_p": None}) == run
    assert call_sampling({"temperature": None, "top_p": 0.9}, {}) == {"top_p": 0.9}


def test_the_rule_as_a_run_says_it():
    from recurrent.sampling import describe_rule

    line = describe_rule({"temperature": 1.0, "top_p": 1}, "actor_rollout_ref.rollout")
    assert line.startswith("sampling: temperature 1, top_p 1 (actor_rollout_ref.rollout) for calls that set neither")
    assert "a call that sets one gets 1.0 for the other" in line
