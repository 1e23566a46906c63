"""Zero-shot copying in SmolLM2-135M truncated to its first k layers (logit lens through the final norm + head).

A sequence of 60 random word tokens is repeated; the NLL on the second copy vs the first measures induction
(copying). Also: the NLL of a needle's number when the needle appears earlier in a task prompt.
"""

from __future__ import annotations

import random

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoTokenizer

from recurrent.models import models_dir

torch.set_num_threads(1)
SRC = models_dir() / "smollm2-135m-instruct"  # the offline model cache (MEMAGENT_MODELS_DIR)
tok = AutoTokenizer.from_pretrained(SRC)
model = AutoModelForCausalLM.from_pretrained(SRC, dtype=torch.float32).eval()
layers = model.model.layers
rng = random.Random(0)
words = [i for i in range(1000, 20000)]
seqs = []
for _ in range(4):
    s = [rng.choice(words) for _ in range(60)]
    seqs.append([tok.bos_token_id or 1] + s + s)
ids = torch.tensor(seqs)
with torch.no_grad():
    for k in (2, 4, 6, 30):
        model.model.layers = layers[:k]
        model.config.num_hidden_layers = k
        logits = model(ids).logits[:, :-1]
        nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1), reduction="none")
        nll = nll.view(ids.shape[0], -1)
        first, second = nll[:, 1:60].mean().item(), nll[:, 61:].mean().item()
        top1 = (logits[:, 61:].argmax(-1) == ids[:, 62:]).float().mean().item()
        print(f"k={k:2d} nll_first={first:.2f} nll_repeat={second:.2f} top1_repeat={top1:.2f}", flush=True)

# layer-dropping: first a + last b layers (the head expects a late residual stream)
with torch.no_grad():
    for a, b in ((2, 2), (3, 3), (4, 4), (2, 6), (6, 6), (8, 4)):
        model.model.layers = torch.nn.ModuleList(list(layers[:a]) + list(layers[30 - b :]))
        model.config.num_hidden_layers = a + b
        for i, layer in enumerate(model.model.layers):
            layer.self_attn.layer_idx = i
        logits = model(ids).logits[:, :-1]
        nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1), reduction="none")
        nll = nll.view(ids.shape[0], -1)
        first, second = nll[:, 1:60].mean().item(), nll[:, 61:].mean().item()
        top1 = (logits[:, 61:].argmax(-1) == ids[:, 62:]).float().mean().item()
        print(f"first{a}+last{b} nll_first={first:.2f} nll_repeat={second:.2f} top1_repeat={top1:.2f}", flush=True)
