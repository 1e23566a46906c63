"""The original MemAgent's Hydra keys on our configs: each key its launch scripts set that is named otherwise here is
rewritten to our key (with a note), and each that has no counterpart is refused in one line naming what replaced
it, before Hydra composes anything (Hydra would say "not in struct", or, given with ``+``, add a key nothing
reads). ``python -m verl_ext.main`` applies it to its overrides; the table is README's "Coming from the original".
"""

from __future__ import annotations

import re

# original key (or key prefix, ending in ".") -> our key (or prefix)
RENAMED: dict[str, str] = {
    "recurrent.memory.config.": "recurrent.config.",
    "recurrent.enable": "recurrent.agent",
    "data.context_key": "recurrent.config.context_key",
    "algorithm.grpo_use_adv": "algorithm.norm_adv_by_std_in_grpo",
    "actor_rollout_ref.rollout.mode": "recurrent.mode",
}

# original key -> (the values refused, None: any; what replaced it)
REFUSED: dict[str, tuple[tuple[str, ...] | None, str]] = {
    "reward_model.reward_manager": (
        None,
        "the fork's process-pool reward manager; here stock verl's reward loop runs the configured reward function "
        "(reward.custom_reward_function.path / .name; reward.reward_manager.name, dapo by default)",
    ),
    "actor_rollout_ref.rollout.chat_scheduler": (
        None,
        "the fork's async scheduler; here recurrent.mode=async (MODE=async of the launchers)",
    ),
    "data.truncation": (
        ("center", "'center'"),
        "the memory agent centre-truncates the context itself (recurrent.config.max_chunks x chunk_size); "
        "data.truncation applies to the question column only",
    ),
}

OVERRIDE = re.compile(r"(?P<prefix>\+{0,2}|~)(?P<key>[A-Za-z_][\w.]*)(?P<rest>(=.*)?)", re.S)


class OriginalKeyError(ValueError):
    """An override of the original's that has no counterpart here; the message names what replaced it."""


def our_key(key: str) -> str | None:
    """Our name of an original key, or None when it is not renamed."""
    for old, new in RENAMED.items():
        if key == old or (old.endswith(".") and key.startswith(old)):
            return new + key[len(old) :]
    return None


def translate(override: str) -> tuple[str, str | None]:
    """``(the override on our keys, a note when rewritten)``; :class:`OriginalKeyError` for a refused one. An
    override that is not the original's comes back as it is."""
    match = OVERRIDE.fullmatch(override)
    if match is None:
        return override, None
    key, rest = match["key"], match["rest"]
    if key in REFUSED:
        values, replacement = REFUSED[key]
        if values is None or rest[1:] in values:
            raise OriginalKeyError(f"{override}: the original's key, not read here: {replacement}")
        return override, None
    new = our_key(key)
    if new is None:
        return override, None
    # Our key exists in the config: a `+` (the original's way to add its own keys) would fail on it.
    prefix = "~" if match["prefix"] == "~" else ""
    rewritten = f"{prefix}{new}{rest}"
    return rewritten, f"{override} is the original's key: read as {rewritten}"


def translate_overrides(overrides: list[str]) -> tuple[list[str], list[str]]:
    """Every override translated (:func:`translate`), and the notes of those rewritten."""
    pairs = [translate(override) for override in overrides]
    return [new for new, _ in pairs], [note for _, note in pairs if note]
