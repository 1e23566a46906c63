"""Adaptation 7 (verl_ext/cpu/logprobs.py): fp32 log-probabilities a block of tokens at a time, in place of verl's
loop over tokens. The values and gradients are verl's own function's (and a hand-worked pair); bf16 and processes
outside the CPU platform go to verl's function; the CPU platform's processes get the patch through the loader."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from verl.utils import torch_functional

from verl_ext.cpu import logprobs

REPO = Path(__file__).resolve().parents[3]

# verl's own function, whether or not this process has installed the patch
VERL_LOGPROBS = torch_functional.logprobs_from_logits_v2
VERL_LOGPROBS = getattr(VERL_LOGPROBS, "__wrapped__", VERL_LOGPROBS)


def test_a_hand_worked_pair():
    # logits (0, ln 3): softmax (1/4, 3/4), so log-probabilities ln(1/4) for label 0 and ln(3/4) for label 1
    logits = torch.tensor([[0.0, math.log(3.0)], [0.0, math.log(3.0)]])
    got = logprobs.logprobs_in_blocks(logits, torch.tensor([0, 1]))
    assert got.tolist() == pytest.approx([math.log(0.25), math.log(0.75)], abs=1e-6)


@pytest.mark.parametrize("shape", [(logprobs.ROWS_PER_BLOCK * 2 + 5, 97), (3, 7, 31)])
def test_values_and_gradients_are_verls(shape):
    """Packed rows over three blocks (the engine's call), and a (batch, sequence, vocabulary) tensor."""
    generator = torch.Generator().manual_seed(0)
    logits = (3 * torch.randn(shape, generator=generator, dtype=torch.float32)).requires_grad_()
    labels = torch.randint(0, shape[-1], shape[:-1], generator=generator)
    weights = torch.randn(shape[:-1], generator=generator)  # a loss that weighs every token differently

    expected = VERL_LOGPROBS(logits, labels)
    (expected_grad,) = torch.autograd.grad((expected * weights).sum(), logits)
    got = logprobs.logprobs_in_blocks(logits, labels)
    (got_grad,) = torch.autograd.grad((got * weights).sum(), logits)
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
    torch.testing.assert_close(got_grad, expected_grad, rtol=0, atol=1e-6)


def test_only_fp32_in_a_cpu_platform_process_takes_blocks(monkeypatch):
    fp32, fp64, bf16 = (torch.zeros(2, 3, dtype=d) for d in (torch.float32, torch.float64, torch.bfloat16))
    monkeypatch.setenv("VERL_PLATFORM", "cpu")
    assert logprobs.takes_blocks(fp32) and logprobs.takes_blocks(fp64) and not logprobs.takes_blocks(bf16)
    monkeypatch.delenv("VERL_PLATFORM")
    assert not logprobs.takes_blocks(fp32)  # a GPU host, or a test process that registered the adaptations


def test_the_cpu_platform_loader_installs_it():
    """``import verl`` with the loader, as every Ray process of a CPU run: verl's logprobs_from_logits reaches the
    block path for fp32 (its result is the blocks'), and verl's own loop for bf16 (bit for bit)."""
    env = {**os.environ, "VERL_PLATFORM": "cpu", "VERL_USE_EXTERNAL_MODULES": "verl_ext.cpu.load"}
    env["OMP_NUM_THREADS"] = "1"
    code = textwrap.dedent(
        """
        import json, torch
        import verl
        from verl.utils import torch_functional as tf
        from verl_ext.cpu import logprobs
        g = torch.Generator().manual_seed(1)
        x, y = torch.randn(300, 50, generator=g), torch.randint(0, 50, (300,), generator=g)
        patched = getattr(tf.logprobs_from_logits_v2, "__verl_ext_cpu_patched__", False)
        fp32 = torch.equal(tf.logprobs_from_logits(x, y), logprobs.logprobs_in_blocks(x, y))
        xb = x.bfloat16()
        bf16 = torch.equal(tf.logprobs_from_logits(xb, y), tf.logprobs_from_logits_v2.__wrapped__(xb, y))
        print(json.dumps({"patched": patched, "fp32": fp32, "bf16": bf16}))
        """
    )
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"patched": True, "fp32": True, "bf16": True}


def test_the_bench_prints_both_routes_and_their_agreement():
    """scripts/bench_logprobs.py at a toy size: one line per size and pass, the two routes' values and gradients
    agreeing (its last column)."""
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "bench_logprobs.py"), "--vocab", "50", "--tokens", "64", "1500"],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line.split() for line in done.stdout.splitlines()[2:]]
    assert [(row[0], row[1]) for row in rows] == [
        ("64", "forward+backward"),
        ("64", "forward"),
        ("1500", "forward+backward"),
        ("1500", "forward"),
    ]
    assert all(float(row[-1]) <= 1e-6 and float(row[-2]) > 0 for row in rows)
