"""Adaptation 8: vLLM's CPU linear layers keep their weights, so verl's weight sync can load new ones.

On the CPU platform, vLLM's ``UnquantizedLinearMethod.process_weights_after_loading`` hands each linear layer's
weight to a packed kernel (oneDNN, or the SGL kernel) and replaces the parameter with an empty one
(``vllm/model_executor/layers/linear.py:213-215`` calls ``dispatch_cpu_unquantized_gemm(layer,
remove_weight=True)``, ``vllm/model_executor/layers/utils.py:228-320``). A model loaded once is then fine to serve,
but verl's weight sync loads every update into those parameters (``model.load_weights``,
``verl/workers/rollout/vllm_rollout/utils.py:405``) and fails on the first stacked one: ``AssertionError: Attempted
to load weight (torch.Size([128, 128])) into parameter (torch.Size([0]))``.

Here the dispatch is called with ``remove_weight=False``: the parameter keeps its shape, the update loads into it,
and verl's ``process_weights_after_loading`` after the last bucket (``utils.py:350-353``) builds the packed kernel
again from the new weights, so the served policy is the updated one. The cost is a second copy of each linear
weight on the host (the packed one beside the parameter).

Installed only in processes of the CPU platform (``VERL_PLATFORM=cpu``; the vLLM engine's worker process inherits
it from verl's ``vLLMHttpServer`` and imports verl through its worker extension, so ``verl_ext.cpu.load`` runs
there), and only on the vLLM release it was checked against.

Upstream change that would make this unnecessary: vLLM's CPU dispatch keeping (or restoring) the parameter for a
reload, as its layerwise reload (``vllm/model_executor/model_loader/reload``) does for quantized layers.
"""

from __future__ import annotations

import functools
from types import ModuleType

TARGET_MODULE = "vllm.model_executor.layers.utils"
TARGET_FUNCTION = "dispatch_cpu_unquantized_gemm"
SUPPORTED_VLLM = "0.24.0"


def require_vllm(module: ModuleType) -> None:
    """Refuse to patch a vLLM release this adaptation was not checked against."""
    import vllm

    version = getattr(vllm, "__version__", "")
    if version.split("+")[0] != SUPPORTED_VLLM:
        raise RuntimeError(
            f"verl_ext.cpu: the patch of {module.__name__}.{TARGET_FUNCTION} was checked on vLLM {SUPPORTED_VLLM}, "
            f"but vLLM {version} is installed; re-check it against that release (verl_ext/cpu/README.md, adaptation 8)"
        )


def apply(module: ModuleType) -> None:
    """Rebind ``dispatch_cpu_unquantized_gemm`` of ``module`` to keep the weight (idempotent). vLLM's linear layers
    import the name from the module at each call, so rebinding the module's attribute is enough."""
    original = getattr(module, TARGET_FUNCTION)
    if getattr(original, "__verl_ext_cpu_patched__", False):
        return
    require_vllm(module)

    @functools.wraps(original)
    def dispatch_cpu_unquantized_gemm(layer, remove_weight: bool) -> None:
        original(layer, remove_weight=False)

    dispatch_cpu_unquantized_gemm.__verl_ext_cpu_patched__ = True
    dispatch_cpu_unquantized_gemm.__wrapped__ = original
    setattr(module, TARGET_FUNCTION, dispatch_cpu_unquantized_gemm)


def head_size(config: dict) -> int:
    """The attention head size of a Hugging Face ``config.json`` (its ``head_dim``, else hidden / heads)."""
    return int(config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"])


def model_problem(model_dir: str) -> str | None:
    """Why vLLM's CPU attention cannot serve the model in ``model_dir``, or None. It has kernels for some head sizes
    only (``CPUAttentionBackend.get_supported_head_sizes``); another fails at the engine's start, minutes in, with
    ``Unsupported CPU attention configuration: head_dim=16``."""
    import json
    from pathlib import Path

    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    config_file = Path(model_dir) / "config.json"
    if not config_file.is_file():
        return f"{model_dir}: no config.json (a Hugging Face model folder is needed)"
    size = head_size(json.loads(config_file.read_text()))
    supported = CPUAttentionBackend.get_supported_head_sizes()
    if size not in supported:
        return (
            f"{model_dir}: attention heads of size {size}, which vLLM's CPU attention does not serve (it serves "
            f"{', '.join(map(str, supported))}); use a model with one of those (the offline tiny-head64, "
            "smollm2-135m-instruct) or the transformers rollout (ROLLOUT=hf_cpu)"
        )
    return None


def main(argv: list[str] | None = None) -> int:
    import argparse
    import sys

    parser = argparse.ArgumentParser(
        prog="python -m verl_ext.cpu.vllm_cpu", description="Checks for vLLM on the CPU platform (docs/cluster.md)."
    )
    parser.add_argument(
        "--check-model", metavar="FOLDER", required=True, help="exit 2 if vLLM's CPU attention cannot serve it"
    )
    args = parser.parse_args(argv)
    problem = model_problem(args.check_model)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
