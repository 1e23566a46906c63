"""scripts/bench_update_kernels.py at toy size on CPU: the cases it times, the tokens and FLOP it counts (by hand),
the JSON it writes, and its refusals. On a GPU it runs the 7B-shaped stack (docs/cluster.md, "The update's kernels
on one GPU")."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_update_kernels.py"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300)


@pytest.mark.slow(seconds=25)
def test_the_toy_stack_is_timed_and_counted(tmp_path):
    out = tmp_path / "result.json"
    done = run(
        "--toy", "--device", "cpu", "--layers", "1", "2", "--repeats", "1", "--warmup", "0",
        "--peak-tflops", "1", "--out", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert result["lengths"] == [48, 36] and result["dtype"] == "float32"
    assert result["packed"] == "not measured: the flash_attn package is not installed"
    runs = {(r["layers"], r["case"], r["pass"]): r for r in result["runs"]}
    assert set(runs) == {(n, c, p) for n in (1, 2) for c in ("padded", "equal") for p in ("forward", "update")}
    # The toy stack: hidden 64, 4 heads of 16, 2 KV heads, intermediate 128, vocabulary 256, untied. One layer's
    # weights: q, o 2 x 64 x 64 + k, v 2 x 64 x 32 + MLP 3 x 64 x 128 = 36,864; with the head 64 x 256: 53,248 a token,
    # 106,496 FLOP. Attention: 4 x 4 x 16 = 256 FLOP a pair and layer.
    padded = runs[(1, "padded", "forward")]
    # Rows of 48 and 36 padded to 48: 96 positions, two full 48 x 48 squares (a mask: no causal skipping).
    assert (padded["tokens"], padded["computed_tokens"]) == (84, 96)
    assert padded["flops"] == 106_496 * 96 + 256 * 2 * 48 * 48
    equal = runs[(1, "equal", "forward")]
    # Two rows of 48: no mask, causal: 2 x 48 x 49 / 2 pairs.
    assert equal["flops"] == 106_496 * 96 + 256 * 48 * 49
    # The update: forward, backward (2x) and the recomputed forward of gradient checkpointing.
    assert runs[(1, "padded", "update")]["flops"] == 4 * padded["flops"]
    assert runs[(2, "equal", "forward")]["flops"] == (106_496 + 73_728) * 96 + 2 * 256 * 48 * 49
    for r in result["runs"]:
        assert r["utilisation"] == pytest.approx(r["flops"] / r["seconds"] / 1e12)
        assert r["tokens_per_s"] == pytest.approx(r["tokens"] / r["seconds"])
    assert equal["tokens"] == equal["computed_tokens"] == 96
    # Extrapolated to the toy's 28 layers from the 1- and 2-layer times.
    assert {(r["case"], r["pass"]) for r in result["full_depth"]} == {(c, p) for _, c, p in runs}
    assert "padded forward" in done.stdout and "28 layers (extrapolated)" in done.stdout


def test_refusals_exit_2():
    done = run("--toy", "--device", "cpu", "--lengths", "8")
    assert done.returncode == 2 and "--lengths [8]: two or more rows of at least 2 tokens" in done.stderr
    import torch

    if not torch.cuda.is_available():
        done = run("--toy")
        assert done.returncode == 2 and "--device cuda: no CUDA device visible" in done.stderr
