"""How fast does a ~1M-param scratch Qwen2 learn to COPY at 1 CPU thread? (copy-emergence probe)

python scripts/probes/copy_emerge.py TOK_DIR --task synth|needle|paper [--layers 4] [--lr 3e-3] [--batch 32]
  [--span 4 12] [--seq 64] [--minutes 6] [--init MODEL_DIR] [--save OUT_DIR]

TOK_DIR: a folder with the SmolLM2 tokenizer and ``vocab_map.json`` (e.g. make_scratch.py output); the model
is a fresh Qwen2 (h128, 8 heads / 4 KV, inter 512, vocab 356), or ``--init`` weights.

Tasks (loss on the copy only):
- ``synth``: random task-vocab tokens, a marked span ``A x1..xk B`` somewhere, and at the end ``A x1..xk B``
  again: the repeat is pure induction (prev-token head + induction head).
- ``needle``: one ~60-token filler chunk with the needle at a random sentence position, then "\\nmemory:";
  target = " The special magic number for KEY is NNNN." + eos.
- ``paper``: the same chunk in the paper's memory prompt (chat template, ~200 tokens); target = needle + eos.

Metrics on held-out rows (teacher-forced argmax, one forward): ``tok_acc`` = per copy-token accuracy; ``exact`` =
rows whose every target token is the argmax, which is exactly "greedy decoding reproduces the target". For
needle/paper ``key_num`` is the accuracy on the KEY and NNNN tokens only (the part that must be copied).
Stops when ``--stop`` (exact for needle/paper, tok_acc for synth) is reached or after ``--minutes``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent))
from niah_data import QUESTION, encode_turn, make_doc  # noqa: E402

from recurrent.impls.memory import MEMORY_TEMPLATE, NO_MEMORY, render  # noqa: E402

torch.set_num_threads(1)


class Vocab:
    def __init__(self, tok_dir: Path):
        self.tok = AutoTokenizer.from_pretrained(tok_dir)
        self.keep = json.loads((tok_dir / "vocab_map.json").read_text())
        self.fwd = {t: i for i, t in enumerate(self.keep)}
        self.eos = self.fwd[self.tok.eos_token_id]

    def enc(self, text: str) -> list[int]:
        return [self.fwd.get(i, 0) for i in self.tok(text, add_special_tokens=False).input_ids]


def synth_rows(v: Vocab, rng: random.Random, n: int, seq: int, span: tuple[int, int]):
    """(ids, target_start): [noise] A span B [noise] A span B, length ~seq; loss from the 2nd A's successor."""
    V = len(v.keep)
    A, B = v.enc("{")[0], v.enc("}")[0]
    rows = []
    for _ in range(n):
        k = rng.randint(*span)
        s = [rng.randrange(3, V) for _ in range(k)]
        noise = seq - 2 * (k + 2)
        pre = rng.randint(0, max(0, noise))
        mid = max(0, noise - pre)
        r = lambda m: [rng.randrange(3, V) for _ in range(m)]  # noqa: E731
        ids = r(pre) + [A, *s, B] + r(mid) + [A]
        rows.append((ids + s + [B], len(ids)))
    return rows


def needle_rows(v: Vocab, rng: random.Random, n: int, paper: bool):
    rows = []
    for _ in range(n):
        doc = make_doc(rng, v.tok, 1, 64)
        chunk = " ".join(doc["chunks"][0])
        if paper:
            p = render(MEMORY_TEMPLATE, prompt=QUESTION.format(key=doc["key"]), memory=NO_MEMORY, chunk=chunk)
            a, b = encode_turn(v.tok, p, doc["needle"])
            a, b = [v.fwd.get(i, 0) for i in a], [v.fwd.get(i, 0) for i in b]
        else:
            a, b = v.enc(chunk + "\nmemory:"), v.enc(" " + doc["needle"]) + [v.eos]
        # positions (in b) of the KEY and number tokens: what follows "for" up to the final "."
        pre = v.enc(" The special magic number for" if not paper else "The special magic number for")
        rows.append((a + b, len(a), (len(pre), len(b) - 2)))
    return rows


def forward(model, rows):
    L = max(len(r[0]) for r in rows)
    ids = torch.zeros(len(rows), L, dtype=torch.long)
    att = torch.zeros(len(rows), L, dtype=torch.long)
    pb, pt, lab, rid = [], [], [], []
    for i, r in enumerate(rows):
        s, t0 = r[0], r[1]
        ids[i, : len(s)] = torch.tensor(s)
        att[i, : len(s)] = 1
        for j in range(t0, len(s)):
            pb.append(i)
            pt.append(j - 1)
            lab.append(s[j])
            rid.append(i)
    h = model.model(input_ids=ids, attention_mask=att).last_hidden_state
    logits = model.lm_head(h[pb, pt])
    lab = torch.tensor(lab)
    return F.cross_entropy(logits, lab), logits, lab, rid, sum(len(r[0]) for r in rows)


@torch.no_grad()
def evaluate(model, rows, bs=64):
    model.eval()
    hit, tot, exact, kn_hit, kn_tot = 0, 0, 0, 0, 0
    for i in range(0, len(rows), bs):
        chunk = rows[i : i + bs]
        _, logits, lab, rid, _ = forward(model, chunk)
        ok = (logits.argmax(-1) == lab).tolist()
        hit += sum(ok)
        tot += len(ok)
        per = {}
        for r, o in zip(rid, ok, strict=True):
            per.setdefault(r, []).append(o)
        exact += sum(all(x) for x in per.values())
        for r, oks in per.items():
            if len(chunk[r]) > 2:
                lo, hi = chunk[r][2]
                kn_hit += sum(oks[lo:hi])
                kn_tot += hi - lo
    model.train()
    out = {"tok_acc": round(hit / tot, 3), "exact": round(exact / len(rows), 3)}
    if kn_tot:
        out["key_num"] = round(kn_hit / kn_tot, 3)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tok_dir", type=Path)
    ap.add_argument("--task", default="synth", choices=["synth", "needle", "paper"])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--span", type=int, nargs=2, default=[4, 12])
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--minutes", type=float, default=6)
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--stop", type=float, default=0.9)
    ap.add_argument("--init", type=Path, default=None)
    ap.add_argument("--save", type=Path, default=None)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    v = Vocab(args.tok_dir)
    if args.init:
        model = AutoModelForCausalLM.from_pretrained(args.init, dtype=torch.float32)
    else:
        cfg = Qwen2Config(
            vocab_size=len(v.keep),
            hidden_size=128,
            intermediate_size=512,
            num_hidden_layers=args.layers,
            num_attention_heads=8,
            num_key_value_heads=4,
            max_position_embeddings=4096,
            tie_word_embeddings=True,
            bos_token_id=0,
            eos_token_id=v.eos,
            pad_token_id=0,
        )
        model = Qwen2ForCausalLM(cfg)
    n_params = sum(p.numel() for p in model.parameters())
    rng = random.Random(args.seed + 1)
    held_rng = random.Random(12345)
    t_data = time.time()
    if args.task == "synth":
        held = synth_rows(v, held_rng, 256, args.seq, tuple(args.span))
        make = lambda n: synth_rows(v, rng, n, args.seq, tuple(args.span))  # noqa: E731
    else:
        held = needle_rows(v, held_rng, 200, args.task == "paper")
        pool = needle_rows(v, rng, 4000, args.task == "paper")
        make = lambda n: rng.sample(pool, n)  # noqa: E731
    print(
        json.dumps(
            {**vars(args), "params_M": round(n_params / 1e6, 3), "data_s": round(time.time() - t_data, 1)}, default=str
        ),
        flush=True,
    )
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0, betas=(0.9, 0.98))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / args.warmup))
    key = "tok_acc" if args.task == "synth" else "exact"
    t0, train_s, step, toks, losses = time.time(), 0.0, 0, 0, []
    res = evaluate(model, held)
    print(json.dumps({"step": 0, "min": 0.0, "tokens": 0, **res}), flush=True)
    while True:
        ts = time.time()
        loss, _, _, _, n = forward(model, make(args.batch))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        train_s += time.time() - ts
        step += 1
        toks += n
        losses.append(loss.item())
        if step % args.eval_every == 0 or train_s > args.minutes * 60:
            res = evaluate(model, held)
            rec = {"step": step, "min": round(train_s / 60, 2), "tokens": toks}
            rec |= {"loss": round(sum(losses[-20:]) / len(losses[-20:]), 3), **res}
            print(json.dumps(rec), flush=True)
            if res[key] >= args.stop or train_s > args.minutes * 60:
                break
    print(
        json.dumps(
            {
                "done": True,
                "step": step,
                "train_min": round(train_s / 60, 2),
                "tokens": toks,
                "wall_min": round((time.time() - t0) / 60, 2),
                **res,
            }
        ),
        flush=True,
    )
    if args.save:
        model.save_pretrained(args.save)
        v.tok.save_pretrained(args.save)
        (args.save / "vocab_map.json").write_text(json.dumps(v.keep))


if __name__ == "__main__":
    main()
