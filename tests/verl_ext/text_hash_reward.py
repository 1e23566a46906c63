"""A verl custom reward that differs between trajectories: a hash of the decoded final answer, in [0, 1).

The random tiny model never answers correctly, so the real rewards of a test batch are all 0 and cannot show
whose reward landed on which row. This one can: the test recomputes it from the final row's own tokens.
"""

from __future__ import annotations

import zlib


def text_hash(text: str) -> float:
    return (zlib.crc32(text.encode()) % 10_000) / 10_000


def compute_score(data_source, solution_str: str, ground_truth, extra_info=None, **kwargs) -> float:
    return text_hash(solution_str)
