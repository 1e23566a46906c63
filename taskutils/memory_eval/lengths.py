"""A task's lengths as the report shows them: the nominal context length in tokens (HotpotQA lengths are document
counts, needle lengths chunk counts, BABILong's thousands of tokens), the labels of a table's columns and of a
plot's axis, and the plot panel (family) of a task."""

from __future__ import annotations

from taskutils.memory_eval import config as cfg

# The paper's axis labels for the RULER-HotpotQA document counts (50 documents ~ 7K tokens, doubling with the
# count); other counts use ~140 tokens a document.
HOTPOTQA_TOKENS = {
    50: 7_000,
    100: 14_000,
    200: 28_000,
    400: 56_000,
    800: 112_000,
    1600: 224_000,
    3200: 448_000,
    6400: 896_000,
    12800: 1_750_000,
    25600: 3_500_000,
}
TOKENS_PER_DOC = 140
NEEDLE_CHUNK_TOKENS = 64  # the replication's needle lengths are chunks of 64 reader tokens


def family(task: str) -> str:
    """The plot panel of a task: hotpotqa, niah, vt, fwe, cwe, qa, longbench or babilong."""
    if task.startswith(("longbench_", "babilong_")):
        return task.split("_", 1)[0]
    if task.startswith("niah_"):
        return "niah"
    if task.startswith("qa_"):
        return "qa"
    return task


def context_tokens(task: str, length: int) -> int:
    """The nominal context length of a set, in tokens (HotpotQA lengths are document counts, needle lengths
    chunk counts)."""
    if task == cfg.HOTPOTQA:
        return HOTPOTQA_TOKENS.get(length, length * TOKENS_PER_DOC)
    if task == cfg.NEEDLE:
        return length * NEEDLE_CHUNK_TOKENS
    if task in cfg.BABILONG_QA:
        return length * 1000
    if task in cfg.LONGBENCH_QA:
        return 0  # as published: no one length
    return length


def column_label(task: str, length: int) -> str:
    """A length as a table's column names it: BABILong's config, LongBench as published, else the length and its
    tokens."""
    if task in cfg.BABILONG_QA:
        return cfg.BABILONG_CONFIGS.get(length, f"{length}k")
    if task in cfg.LONGBENCH_QA:
        return "as published"
    return f"{length} ({length_label(context_tokens(task, length))})"


def length_label(tokens: float) -> str:
    if tokens >= 1_000_000:
        return f"{tokens / 1_000_000:.3g}M"
    if tokens >= 1_000:
        return f"{tokens / 1_000:.3g}K"
    return f"{tokens:.0f}"
