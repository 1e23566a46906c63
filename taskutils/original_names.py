"""The original MemAgent's names that mean something else here, each refused in one line that names what replaced
it, so that a habit of the original never runs silently as something else (README, "Coming from the original").

The data folder's variables (``DATAROOT``, ``DATASET_ROOT``) are honoured: :mod:`taskutils.data_root`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

# The variables the original's evaluation read (taskutils/memory_eval/run.py and utils/envs.py there), with what
# took their place in the harness.
EVAL_ENV: dict[str, str] = {
    "SERVE_PORT": "the port of the original's Ray Serve server; here --url http://HOST:PORT/v1 for a server you "
    "started, or no --url and the harness starts `vllm serve` on a free port of its own",
    "SERVE_HOST": "the host of the original's server; here --url http://HOST:PORT/v1",
    "DASH_PORT": "the original's Ray Serve dashboard; here `vllm serve` runs its replicas itself (--replicas), "
    "with no Ray Serve",
    "MODELROOT": "the original's folder of hand-edited 128K Qwen copies; here models.yaml's 128K rows give vLLM "
    "the same YaRN setting over the stock checkpoints, and --models PATH runs a folder of your own",
    "RECURRENT_CHUNK_SIZE": "a memory-agent budget; here the model table's memory: fields or --agent-config FILE "
    "(chunk_size)",
    "RECURRENT_MAX_NEW": "a memory-agent budget; here the model table's memory: fields or --agent-config FILE "
    "(max_new)",
    "RECURRENT_MAX_CONTEXT_LEN": "a memory-agent budget; here the model table's memory: fields or --agent-config "
    "FILE (max_context)",
    "MAX_INPUT_LEN": "the direct baselines' input cap; here the model table's direct: max_input",
    "MAX_OUTPUT_LEN": "the direct baselines' output cap; here the model table's direct: max_output",
}

# The original's --api names (ruler_hqa.py there) and the methods that run the same protocol here.
METHODS: dict[str, str] = {
    "recurrent": "memory",
    "recurrent-boxed": "memory-boxed",
    "openai": "direct",
    "boxed": "direct-boxed",
}

# The original's configuration names (its run.py's CONFIGS) that the model table names otherwise.
MODEL_NAMES: dict[str, str] = {"R1-14B-120k+10k-openai": "R1-14B-120k+10k"}


def env_problem(variables: Mapping[str, str], environ: Mapping[str, str] | None = None) -> str | None:
    """The one line refusing the first of ``variables`` that is set (non-empty) in ``environ``, or None."""
    environ = os.environ if environ is None else environ
    for name, replacement in variables.items():
        if environ.get(name):
            return f"{name}={environ[name]} is the original's and is not read here: {replacement}; unset it"
    return None


def method_problem(method: str) -> str | None:
    """The line for an original ``--api`` name given as a method, or None."""
    if method in METHODS:
        return f"method {method!r} is the original's name of {METHODS[method]!r}: pass --method {METHODS[method]}"
    return None


def model_problem(name: str) -> str | None:
    """The line for an original configuration name the model table names otherwise, or None."""
    if name in MODEL_NAMES:
        return f"model {name!r} is the original's name of {MODEL_NAMES[name]!r}: pass --models {MODEL_NAMES[name]}"
    return None
