"""The original MemAgent's Hydra keys on our configs: each key its launch scripts set that is named otherwise here is
rewritten to our key (with a note), and each that has no counterpart is refused in one line naming what replaced
it, before Hydra composes anything (Hydra would say "not in struct", or, given with ``+``, add a key nothing
reads). ``python -m verl_ext.main`` applies it to its overrides; the table is README's "Coming from the original".
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

# The table itself is data about the original's launch scripts (configs/original_names/hydra_keys.yaml): this
# module stays generic over agents (tests/verl_ext/test_vx_generic.py).
TABLE = Path(__file__).resolve().parent.parent / "configs" / "original_names" / "hydra_keys.yaml"
_table = yaml.safe_load(TABLE.read_text())
RENAMED: dict[str, str] = dict(_table["renamed"])
REFUSED: dict[str, tuple[tuple[str, ...] | None, str]] = {
    key: (tuple(entry["values"]) if entry.get("values") else None, entry["replaced_by"])
    for key, entry in _table["refused"].items()
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
