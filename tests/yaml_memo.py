"""The suite composes Hydra configs a few hundred times in its worker processes, and each composition parses every
YAML file of the config tree again (about 40% of its ~0.9 s of CPU, most of it in PyYAML's pure-Python parser).
:func:`memoize_yaml_parsing` makes OmegaConf's parse of a text it has seen before a copy of the first parse. The
key is the text itself (and the loader), so an edited file is parsed again; the copy keeps one caller's change to
its config out of the next caller's. Composition, interpolation and merging still run each time."""

from __future__ import annotations

import copy
import io
from typing import Any

import omegaconf.omegaconf
import yaml


class _MemoizedYaml:
    """The ``yaml`` module as ``omegaconf.omegaconf`` sees it, with ``load`` memoized by text."""

    def __init__(self) -> None:
        self.parsed: dict[tuple[str, str], Any] = {}
        self.hits = 0

    def load(self, stream: Any, Loader: type) -> Any:  # noqa: N803  (PyYAML's keyword)
        text = stream.read() if hasattr(stream, "read") else stream
        # OmegaConf builds its loader class anew at each load (omegaconf/_utils.py, get_yaml_loader): the same
        # class by name and behaviour, so its name is the key.
        key = (f"{Loader.__module__}.{Loader.__qualname__}", text)
        if key in self.parsed:
            self.hits += 1
        else:
            self.parsed[key] = yaml.load(io.StringIO(text), Loader=Loader)
        return copy.deepcopy(self.parsed[key])

    def __getattr__(self, name: str) -> Any:
        return getattr(yaml, name)


def memoize_yaml_parsing() -> _MemoizedYaml:
    """Install the memo in this process (once) and return it."""
    if not isinstance(omegaconf.omegaconf.yaml, _MemoizedYaml):
        omegaconf.omegaconf.yaml = _MemoizedYaml()
    return omegaconf.omegaconf.yaml
