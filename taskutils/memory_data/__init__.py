"""The paper's datasets: HotpotQA long-context training/eval sets and the RULER OOD sets.

Run ``python -m taskutils.memory_data --help`` for the stages; ``README.md`` beside this file lists the
commands in order. Every stage reads local files only and writes resumable outputs; every sample depends on
(seed, index) only, so results are identical for any worker count.
"""

from taskutils.memory_data.hotpotqa import EVAL_DOC_COUNTS, SynthesisConfig, TooFewDocumentsError
from taskutils.memory_data.output import ConfigMismatchError
from taskutils.memory_data.sources import SourceError, read_essay, read_hotpotqa, read_squad
from taskutils.memory_data.tokenizer import TokenizerUnavailableError, count_tokens, load_tokenizer

__all__ = [
    "EVAL_DOC_COUNTS",
    "ConfigMismatchError",
    "SourceError",
    "SynthesisConfig",
    "TokenizerUnavailableError",
    "TooFewDocumentsError",
    "count_tokens",
    "load_tokenizer",
    "read_essay",
    "read_hotpotqa",
    "read_squad",
]
