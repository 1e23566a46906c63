"""Route A: a Qwen2 model derived from SmolLM2-135M-Instruct's first k layers (optionally a reduced vocab).

Usage: python scripts/probes/derive_smollm.py K OUT_DIR [--vocab]
A Llama layer maps onto Qwen2 with zero q/k/v biases; the script checks that the Qwen2 model's logits equal
those of the truncated Llama model. With --vocab the embedding (tied head) keeps only the task's token ids;
``vocab_map.json`` holds the kept full-vocab ids (new id = index). The tokenizer is copied unchanged (the
probe remaps ids in tensors; a shipped model would need a rebuilt tokenizer).
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

from recurrent.models import models_dir

sys.path.insert(0, str(Path(__file__).resolve().parent))
from niah_data import encode_turn, make_doc, teacher_turns, vocab_ids  # noqa: E402

SRC = models_dir() / "smollm2-135m-instruct"  # the offline model cache (MEMAGENT_MODELS_DIR)


def task_vocab(tok, docs: int = 300) -> list[int]:
    ids = set(vocab_ids(tok))
    rng = random.Random(123)
    for _ in range(docs):
        doc = make_doc(rng, tok, rng.randint(1, 4))
        for _kind, p, t in teacher_turns(doc, rng, "naive"):
            a, b = encode_turn(tok, p, t)
            ids.update(a)
            ids.update(b)
    return sorted(ids)


def derive(k: int, out: Path, reduce_vocab: bool) -> Path:
    torch.set_num_threads(1)
    tok = AutoTokenizer.from_pretrained(SRC)
    llama = AutoModelForCausalLM.from_pretrained(SRC, dtype=torch.float32)
    lc = llama.config
    keep = task_vocab(tok) if reduce_vocab else list(range(lc.vocab_size))
    rope_theta = (getattr(lc, "rope_parameters", None) or {}).get("rope_theta", getattr(lc, "rope_theta", 1e4))
    cfg = Qwen2Config(
        vocab_size=len(keep),
        hidden_size=lc.hidden_size,
        intermediate_size=lc.intermediate_size,
        num_hidden_layers=k,
        num_attention_heads=lc.num_attention_heads,
        num_key_value_heads=lc.num_key_value_heads,
        max_position_embeddings=lc.max_position_embeddings,
        rms_norm_eps=lc.rms_norm_eps,
        rope_theta=rope_theta,
        tie_word_embeddings=True,
        hidden_act=lc.hidden_act,
        bos_token_id=keep.index(lc.bos_token_id) if lc.bos_token_id in keep else 0,
        eos_token_id=keep.index(tok.eos_token_id),
        pad_token_id=0,
        torch_dtype="float32",
    )
    qwen = Qwen2ForCausalLM(cfg).eval()
    sd = llama.state_dict()
    new = {}
    for name, t in qwen.state_dict().items():
        if name.endswith(("q_proj.bias", "k_proj.bias", "v_proj.bias")):
            new[name] = torch.zeros_like(t)
        elif name in ("model.embed_tokens.weight", "lm_head.weight"):
            new[name] = sd["model.embed_tokens.weight"][keep].clone()
        else:
            new[name] = sd[name].clone()
    qwen.load_state_dict(new)
    qwen.tie_weights()
    # check: truncated Llama (k layers) vs Qwen2, on a task row
    llama.model.layers = llama.model.layers[:k]
    llama.config.num_hidden_layers = k
    rng = random.Random(0)
    doc = make_doc(rng, tok, 2)
    pid, tid = encode_turn(tok, *teacher_turns(doc, rng, "naive")[0][1:])
    ids = torch.tensor([pid + tid])
    remap = {t: i for i, t in enumerate(keep)}
    with torch.no_grad():
        a = llama(ids).logits[0][:, keep]
        b = qwen(torch.tensor([[remap[i] for i in pid + tid]])).logits[0]
    diff = (a - b).abs().max().item()
    print(
        f"k={k} vocab={len(keep)} params={sum(p.numel() for p in qwen.parameters()) / 1e6:.2f}M max|dlogit|={diff:.2e}"
    )
    assert diff < 1e-3, diff
    out.mkdir(parents=True, exist_ok=True)
    qwen.save_pretrained(out)
    tok.save_pretrained(out)
    (out / "vocab_map.json").write_text(json.dumps(keep))
    return out


if __name__ == "__main__":
    derive(int(sys.argv[1]), Path(sys.argv[2]), "--vocab" in sys.argv)
