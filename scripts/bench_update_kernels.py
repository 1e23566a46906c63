"""Forward and backward throughput of a Qwen2.5-7B-shaped decoder stack: the actor update's kernels on one GPU.

    python scripts/bench_update_kernels.py [--out result.json]          # an H100: ~2-4 minutes
    python scripts/bench_update_kernels.py --toy --device cpu            # the suite's check, seconds

Needs only torch and transformers (and the repository's ``recurrent/flops.py``, which imports nothing else). A
decoder with the 7B model's widths (hidden 3584, 28 heads, 4 KV heads, intermediate 18944, vocabulary 152064) but
only a few layers, random weights, bf16, runs one micro-batch the way verl's engine runs it (docs/cluster.md,
"What a step costs"):

- ``padded``: two rows of different lengths (8,192 and 6,144 tokens) padded to the longer, with an attention mask:
  sdpa's kernel for a masked batch (``use_remove_padding=false``, the fallback where flash-attn is missing);
- ``equal``: two rows of 8,192 tokens, no padding: sdpa with ``is_causal`` (its flash kernel);
- ``packed``: the two rows of ``padded`` concatenated into one, position ids restarting, under flash_attention_2
  (``use_remove_padding=true``, the paper's setting); only where the flash_attn package is installed.

Each case is timed as the log-prob passes run it (forward, no gradient) and as the update runs it (forward and
backward with gradient checkpointing). It prints real tokens per second and the utilisation of the device's dense
peak by the FLOP the kernels compute (``recurrent.flops``: padding and a masked kernel's full square included).
With two stack depths (``--layers 2 4``) the time per layer is the slope between them, which extrapolates the
utilisation to the full 28 layers (the output head and embedding run once whatever the depth).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from recurrent.flops import BACKWARD_FACTOR, GPU_SPECS, PUBLISHED_SHAPES, ModelShape, forward_count  # noqa: E402

SEVEN_B = PUBLISHED_SHAPES["Qwen/Qwen2.5-7B-Instruct"]
TOY = ModelShape("toy", hidden=64, layers=28, heads=4, kv_heads=2, head_dim=16, intermediate=128, vocab=256, tied=False)


def build(shape: ModelShape, layers: int, dtype, device: str, attention: str):
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(
        hidden_size=shape.hidden,
        num_hidden_layers=layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        intermediate_size=shape.intermediate,
        vocab_size=shape.vocab,
        tie_word_embeddings=shape.tied,
        max_position_embeddings=32768,
        use_cache=False,
    )
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config, attn_implementation=attention)
    finally:
        torch.set_default_dtype(previous)
    return model.to(device=device, dtype=dtype)


def set_attention(model, attention: str) -> None:
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(attention)
    else:  # older transformers
        model.config._attn_implementation = attention


def inputs(lengths: list[int], packed: bool, vocab: int, device: str) -> dict:
    """A micro-batch as verl's engine hands it to the model: packed into one row with restarting position ids, or
    right-padded to the longest row with an attention mask (none when every row is as long)."""
    import torch

    generator = torch.Generator().manual_seed(0)
    rows = [torch.randint(0, vocab, (n,), generator=generator) for n in lengths]
    if packed:
        ids = torch.cat(rows)[None]
        positions = torch.cat([torch.arange(n) for n in lengths])[None]
        return {"input_ids": ids.to(device), "position_ids": positions.to(device)}
    longest = max(lengths)
    ids = torch.zeros(len(rows), longest, dtype=torch.long)
    mask = torch.zeros(len(rows), longest, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)], mask[i, : len(row)] = row, 1
    batch = {"input_ids": ids.to(device)}
    if len(set(lengths)) > 1:
        batch["attention_mask"] = mask.to(device)
    return batch


def run_once(model, batch: dict, train: bool) -> None:
    import torch

    def loss():
        logits = model(**batch).logits.float()  # verl's log-probs: every position's logits, in fp32
        labels = batch["input_ids"][:, 1:]
        return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels.reshape(-1))

    if train:
        loss().backward()
        model.zero_grad(set_to_none=True)
    else:
        with torch.no_grad():
            loss()


def timed(model, batch: dict, train: bool, repeats: int, warmup: int, device: str) -> float:
    """Median seconds of one pass."""
    import torch

    def sync() -> None:
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    for _ in range(warmup):
        run_once(model, batch, train)
    seconds = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        run_once(model, batch, train)
        sync()
        seconds.append(time.perf_counter() - start)
    return sorted(seconds)[len(seconds) // 2]


def cases(lengths: list[int], flash: bool) -> list[tuple[str, list[int], str, bool]]:
    """(name, row lengths, attention implementation, packed)."""
    out = [
        ("padded", lengths, "sdpa", False),
        ("equal", [max(lengths)] * len(lengths), "sdpa", False),
    ]
    if flash:
        out.append(("packed", lengths, "flash_attention_2", True))
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--toy", action="store_true", help="a toy-sized stack (hidden 64) for a CPU check")
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    parser.add_argument("--dtype", choices=("bf16", "fp32"), help="default: bf16 on cuda, fp32 on cpu")
    parser.add_argument("--layers", type=int, nargs="+", default=[2, 4], help="stack depths (default 2 4)")
    parser.add_argument("--lengths", type=int, nargs="+", help="a micro-batch's row lengths (default 8192 6144)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--peak-tflops", type=float, help="dense peak of the device (default: from its name)")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    return parser


def problems_of(args: argparse.Namespace, lengths: list[int]) -> list[str]:
    """What keeps the arguments from running, checked before torch is imported where it can be (seconds)."""
    problems = []
    if min(lengths) < 2 or len(lengths) < 2:
        problems.append(f"--lengths {lengths}: two or more rows of at least 2 tokens")
    if min(args.layers) < 1 or args.repeats < 1 or args.warmup < 0:
        problems.append("--layers and --repeats must be at least 1, --warmup at least 0")
    if not problems:  # torch takes seconds to import: only for arguments that can run
        import torch

        if args.device.startswith("cuda") and not torch.cuda.is_available():
            problems.append("--device cuda: no CUDA device visible (use --device cpu for the toy check)")
    return problems


def device_facts(args: argparse.Namespace) -> tuple[str, float | None, bool]:
    """The device's name, its dense peak in FLOP/s (the flag, else GPU_SPECS's for a GPU named like it, else None),
    and whether the packed case runs (flash_attn installed, on a GPU)."""
    import torch

    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else platform.processor() or "cpu"
    peak = args.peak_tflops * 1e12 if args.peak_tflops else None
    for kind, (_, flops, _) in GPU_SPECS.items():
        if peak is None and kind.upper() in name.upper():  # "NVIDIA H100 80GB HBM3" -> h100
            peak = flops
    try:
        import flash_attn  # noqa: F401

        flash = args.device.startswith("cuda")
    except ImportError:
        flash = False
    return name, peak, flash


def measure(
    args: argparse.Namespace, shape: ModelShape, lengths: list[int], dtype: Any, flash: bool, peak: float | None
) -> list[dict]:
    """Every (depth, case, pass) timed and counted, each printed as it is measured."""
    runs = []
    recompute = 1  # the GPU configs' gradient checkpointing: the update recomputes each forward once
    for layers in args.layers:
        model = build(shape, layers, dtype, args.device, "sdpa")
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        stack = ModelShape(**{**shape.__dict__, "layers": layers})
        for case, rows, attention, packed in cases(lengths, flash):
            set_attention(model, attention)
            batch = inputs(rows, packed, shape.vocab, args.device)
            count = forward_count(stack, rows, packed)
            for mode, train, factor in (("forward", False, 1), ("update", True, 1 + BACKWARD_FACTOR + recompute)):
                model.train(train)
                seconds = timed(model, batch, train, args.repeats, args.warmup, args.device)
                run = {
                    "layers": layers,
                    "case": case,
                    "attention": attention,
                    "pass": mode,
                    "rows": rows,
                    "tokens": count.tokens,
                    "computed_tokens": count.computed_tokens,
                    "flops": count.flops * factor,
                    "seconds": seconds,
                    "tokens_per_s": count.tokens / seconds,
                    "utilisation": count.flops * factor / seconds / peak if peak else None,
                }
                runs.append(run)
                share = f"{run['utilisation']:6.1%}" if peak else "     -"
                print(
                    f"[bench] layers {layers} {case:>6} {mode:>7}: {seconds * 1e3:9.2f} ms, "
                    f"{run['tokens_per_s']:12.0f} tokens/s, {run['flops'] / seconds:9.3g} FLOP/s, {share}"
                )
        del model
    return runs


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    shape = TOY if args.toy else SEVEN_B
    lengths = args.lengths or ([48, 36] if args.toy else [8192, 6144])
    problems = problems_of(args, lengths)
    if problems:
        print("[bench] " + "; ".join(problems), file=sys.stderr)
        return 2
    import torch
    import transformers

    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype or ("bf16" if args.device != "cpu" else "fp32")]
    name, peak, flash = device_facts(args)
    result = {
        "device": name,
        "peak_flops": peak,
        "dtype": str(dtype).removeprefix("torch."),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "shape": shape.name,
        "lengths": lengths,
        "packed": "measured" if flash else "not measured: the flash_attn package is not installed",
    }
    known = f"peak {peak / 1e12:g} TFLOP/s" if peak else "no peak known (--peak-tflops)"
    versions = f"torch {torch.__version__}, transformers {transformers.__version__}"
    print(f"[bench] {name}, {result['dtype']}, {versions}; {known}")
    result["runs"] = measure(args, shape, lengths, dtype, flash, peak)
    if len(args.layers) >= 2:
        result["full_depth"] = extrapolate(result["runs"], shape, peak)
        for row in result["full_depth"]:
            share = f"{row['utilisation']:6.1%}" if peak else "     -"
            print(
                f"[bench] {shape.layers} layers (extrapolated) {row['case']:>6} {row['pass']:>7}: "
                f"{row['seconds'] * 1e3:9.2f} ms, {row['tokens_per_s']:12.0f} tokens/s, {share}"
            )
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    return 0


def extrapolate(runs: list[dict], shape: ModelShape, peak: float | None) -> list[dict]:
    """Time per layer from the shallowest and deepest stacks, then the full depth's time and utilisation."""
    out = []
    low, high = min(r["layers"] for r in runs), max(r["layers"] for r in runs)
    for case, mode in dict.fromkeys((r["case"], r["pass"]) for r in runs):
        a = next(r for r in runs if (r["case"], r["pass"], r["layers"]) == (case, mode, low))
        b = next(r for r in runs if (r["case"], r["pass"], r["layers"]) == (case, mode, high))
        per_layer = (b["seconds"] - a["seconds"]) / (high - low)
        seconds = b["seconds"] + per_layer * (shape.layers - high)
        flops = b["flops"] + (b["flops"] - a["flops"]) / (high - low) * (shape.layers - high)
        out.append(
            {
                "case": case,
                "pass": mode,
                "seconds": seconds,
                "tokens_per_s": b["tokens"] / seconds,
                "utilisation": flops / seconds / peak if peak else None,
            }
        )
    return out


if __name__ == "__main__":
    sys.exit(main())
