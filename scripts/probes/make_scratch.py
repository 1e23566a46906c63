"""Route B: a random-init Qwen2 on the SmolLM2 tokenizer restricted to the task vocab (digits are one token each).

python scripts/probes/make_scratch.py VOCAB_FROM_DIR OUT_DIR [hidden layers heads kv_heads intermediate]
VOCAB_FROM_DIR is a folder written by derive_smollm.py --vocab (its vocab_map.json and tokenizer are reused).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import torch
from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

src, out = Path(sys.argv[1]), Path(sys.argv[2])
hidden, layers, heads, kv, inter = (int(x) for x in (sys.argv[3:8] or [128, 4, 8, 4, 512]))
keep = json.loads((src / "vocab_map.json").read_text())
tok = AutoTokenizer.from_pretrained(src)
cfg = Qwen2Config(
    vocab_size=len(keep),
    hidden_size=hidden,
    intermediate_size=inter,
    num_hidden_layers=layers,
    num_attention_heads=heads,
    num_key_value_heads=kv,
    max_position_embeddings=8192,
    tie_word_embeddings=True,
    bos_token_id=0,
    eos_token_id=keep.index(tok.eos_token_id),
    pad_token_id=0,
    torch_dtype="float32",
)
torch.manual_seed(0)
model = Qwen2ForCausalLM(cfg)
out.mkdir(parents=True, exist_ok=True)
model.save_pretrained(out)
tok.save_pretrained(out)
shutil.copy(src / "vocab_map.json", out / "vocab_map.json")
print(f"params={sum(p.numel() for p in model.parameters()) / 1e6:.2f}M vocab={len(keep)}")
