"""SFT warm-start probe on memory-agent NIAH transcripts, one CPU thread.

python scripts/probes/sft_probe.py MODEL_DIR --minutes M [--lr 3e-4] [--teacher naive|oracle] [--bench]
  [--copy-minutes C]  (route B: a copy pre-task first)

MODEL_DIR is a Qwen2 HF folder; a ``vocab_map.json`` there maps full-tokenizer ids to model ids.
The loss is on target tokens only and the LM head runs on target positions only. Prints JSON lines:
throughput, loss and held-out metrics (teacher-forced prompts, greedy targets; plus an end-to-end loop).
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
from transformers import AutoModelForCausalLM, AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from niah_data import BOXED_RE, NEEDLE_RE, encode_turn, make_doc, teacher_turns  # noqa: E402

from recurrent.impls.memory import FINAL_TEMPLATE_BOXED, MEMORY_TEMPLATE, NO_MEMORY, render  # noqa: E402

torch.set_num_threads(1)


class Task:
    def __init__(self, model_dir: Path, tok_dir: Path | None = None):
        self.tok = AutoTokenizer.from_pretrained(tok_dir or model_dir)
        vm = model_dir / "vocab_map.json"
        self.keep = json.loads(vm.read_text()) if vm.exists() else None
        self.fwd = {t: i for i, t in enumerate(self.keep)} if self.keep else None
        self.eos = self.map([self.tok.eos_token_id])[0]

    def map(self, ids):
        return [self.fwd.get(i, 0) for i in ids] if self.fwd else list(ids)

    def unmap(self, ids):
        return [self.keep[i] for i in ids] if self.keep else list(ids)

    def decode(self, ids):
        return self.tok.decode(self.unmap(ids), skip_special_tokens=True)

    def rows(self, n_docs: int, seed: int, teacher: str, max_chunks: int = 4):
        rng = random.Random(seed)
        out = []
        for _ in range(n_docs):
            doc = make_doc(rng, self.tok, rng.randint(1, max_chunks))
            for kind, p, t in teacher_turns(doc, rng, teacher):
                a, b = encode_turn(self.tok, p, t)
                out.append((self.map(a), self.map(b), kind, p, t, doc))
        return out


def batch_loss(model, rows):
    """Mean target-token NLL; the head runs on target positions only."""
    seqs = [a + b for a, b, *_ in rows]
    L = max(map(len, seqs))
    ids = torch.zeros(len(seqs), L, dtype=torch.long)
    att = torch.zeros(len(seqs), L, dtype=torch.long)
    pos_b, pos_t, labels = [], [], []
    for i, (s, (a, _b, *_)) in enumerate(zip(seqs, rows, strict=False)):
        ids[i, : len(s)] = torch.tensor(s)
        att[i, : len(s)] = 1
        for j in range(len(a), len(s)):
            pos_b.append(i)
            pos_t.append(j - 1)
            labels.append(s[j])
    h = model.model(input_ids=ids, attention_mask=att).last_hidden_state
    logits = model.lm_head(h[pos_b, pos_t])
    return F.cross_entropy(logits, torch.tensor(labels)), sum(map(len, seqs))


@torch.no_grad()
def greedy(model, task, prompt_ids, max_new=40):
    out = model.generate(
        torch.tensor([prompt_ids]),
        max_new_tokens=max_new,
        do_sample=False,
        eos_token_id=task.eos,
        pad_token_id=0,
        attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
    )
    gen = out[0, len(prompt_ids) :].tolist()
    ended = task.eos in gen
    if ended:
        gen = gen[: gen.index(task.eos)]
    return task.decode(gen).strip(), ended


@torch.no_grad()
def evaluate(model, task, rows, e2e_docs):
    model.eval()
    m = {
        "mem_verbatim": [],
        "needle_written": [],
        "needle_exact": [],
        "final_boxed": [],
        "final_right": [],
        "tf_exact": [],
    }
    for i, (a, _b, kind, prompt, target, doc) in enumerate(rows):
        text, ended = greedy(model, task, a)
        if i < 4:
            print(json.dumps({"sample": i, "target": target, "got": text, "ended": ended}), flush=True)
        m["tf_exact"].append(ended and text == target)
        if kind == "memory":
            chunk = prompt.split("<section>\n")[1].split("\n</section>")[0]
            mem = prompt.split("<memory>\n")[1].split("\n</memory>")[0]
            sents = [s for s in doc["chunks"] if " ".join(s) == chunk][0]
            m["mem_verbatim"].append(ended and (text in sents or text == mem))
            if doc["needle"] in sents:
                m["needle_written"].append(ended and text == doc["needle"])
            if NEEDLE_RE.search(text):
                m["needle_exact"].append(text == doc["needle"])
        else:
            bm = BOXED_RE.fullmatch(text)
            m["final_boxed"].append(ended and bm is not None)
            nm = NEEDLE_RE.search(prompt.split("<memory>\n")[1])
            if nm:
                m["final_right"].append(bm is not None and bm.group(1) == nm.group(2))
    res = {k: (round(sum(v) / len(v), 3), len(v)) for k, v in m.items() if v}
    # end-to-end: the model's own memory loop
    correct = 0
    for doc in e2e_docs:
        q = f"What is the special magic number for {doc['key']} mentioned in the provided text?"
        memory = NO_MEMORY
        for sents in doc["chunks"]:
            p = render(MEMORY_TEMPLATE, prompt=q, memory=memory, chunk=" ".join(sents))
            memory, _ = greedy(model, task, task.map(encode_turn(task.tok, p, "")[0]), 40)
        text, _ = greedy(
            model,
            task,
            task.map(encode_turn(task.tok, render(FINAL_TEMPLATE_BOXED, prompt=q, memory=memory), "")[0]),
            12,
        )
        bm = BOXED_RE.search(text)
        correct += bool(bm and bm.group(1) == doc["value"])
    res["e2e_acc"] = (round(correct / len(e2e_docs), 3), len(e2e_docs))
    model.train()
    return res


def copy_rows(task, rng, n):
    """Route B pre-task on task-vocab tokens. Half: a random span (8-48 tokens) shown once, then repeated
    (induction). Half: a marked span "The special magic number for <random tokens>." hidden in random
    tokens, to be copied out (the needle-copy structure). Loss on the copy only."""
    V = len(task.keep) if task.keep else task.tok.vocab_size
    marker = task.map(task.tok("The special magic number for", add_special_tokens=False).input_ids)
    dot = task.map(task.tok(".", add_special_tokens=False).input_ids)
    rows = []
    for _ in range(n):
        s = [rng.randrange(3, V) for _ in range(rng.randint(8, 48))]
        if rng.random() < 0.5:
            rows.append((s + [task.eos], s + [task.eos]))
        else:
            s = marker + s[:16] + dot
            pre = [rng.randrange(3, V) for _ in range(rng.randint(0, 150))]
            post = [rng.randrange(3, V) for _ in range(rng.randint(0, 60))]
            rows.append((pre + s + post + [task.eos], s + [task.eos]))
    return rows


def bench(model, task, rows, reps=3):
    torch.manual_seed(0)
    batch = rows[:4]
    ntok = sum(len(a) + len(b) for a, b, *_ in batch)
    with torch.no_grad():
        batch_loss(model, batch)
        t = time.perf_counter()
        for _ in range(reps):
            batch_loss(model, batch)
        fwd = reps * ntok / (time.perf_counter() - t)
    t = time.perf_counter()
    for _ in range(reps):
        loss, _ = batch_loss(model, batch)
        loss.backward()
    fb = reps * ntok / (time.perf_counter() - t)
    model.zero_grad()
    # decode speed (KV cache), tokens/s, one row
    a = batch[0][0]
    t = time.perf_counter()
    with torch.no_grad():
        model.generate(torch.tensor([a]), max_new_tokens=32, min_new_tokens=32, do_sample=False, pad_token_id=0)
    gen_s = time.perf_counter() - t
    return {
        "rows_tokens_mean": ntok / len(batch),
        "fwd_tok_s": round(fwd),
        "fwdbwd_tok_s": round(fb),
        "prefill+32dec_s": round(gen_s, 3),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model_dir", type=Path)
    ap.add_argument("--tok-dir", type=Path, default=None)
    ap.add_argument("--minutes", type=float, default=5)
    ap.add_argument("--copy-minutes", type=float, default=0)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--teacher", default="naive")
    ap.add_argument("--eval-every", type=float, default=2.5, help="minutes")
    ap.add_argument("--bench", action="store_true")
    ap.add_argument("--eval-rows", type=int, default=20, help="held-out docs for teacher-forced eval")
    args = ap.parse_args()
    torch.manual_seed(0)
    task = Task(args.model_dir, args.tok_dir)
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32)
    n_params = sum(p.numel() for p in model.parameters())
    print(
        json.dumps(
            {"model": str(args.model_dir), "params_M": round(n_params / 1e6, 2), "vocab": model.config.vocab_size}
        ),
        flush=True,
    )
    t0 = time.time()
    train = task.rows(1500, 1, args.teacher)
    held = task.rows(args.eval_rows, 2, args.teacher)
    rng = random.Random(3)
    e2e = [make_doc(rng, task.tok, rng.randint(1, 4)) for _ in range(20)]
    print(json.dumps({"train_rows": len(train), "data_s": round(time.time() - t0, 1)}), flush=True)
    if args.bench:
        print(json.dumps(bench(model, task, train)), flush=True)
    if args.minutes <= 0 and args.copy_minutes <= 0:
        print(json.dumps({"step": 0, "eval": evaluate(model, task, held, e2e)}), flush=True)
        return
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / args.warmup))
    model.train()
    rng = random.Random(4)
    # route B: copy pre-task
    t0 = time.time()
    step = 0
    while time.time() - t0 < args.copy_minutes * 60:
        rows = [(a, b, None) for a, b in copy_rows(task, rng, args.batch)]
        loss, _ = batch_loss(model, rows)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        step += 1
        if step % 50 == 0:
            print(
                json.dumps(
                    {"copy_step": step, "min": round((time.time() - t0) / 60, 2), "loss": round(loss.item(), 3)}
                ),
                flush=True,
            )
    t0 = time.time()
    next_eval = args.eval_every
    step, toks, losses = 0, 0, []
    while True:
        el = (time.time() - t0) / 60
        if el >= next_eval or el >= args.minutes:
            t_ev = time.time()
            res = evaluate(model, task, held, e2e)
            print(
                json.dumps(
                    {
                        "step": step,
                        "train_min": round(el, 2),
                        "tokens": toks,
                        "loss_recent": round(sum(losses[-20:]) / max(1, len(losses[-20:])), 3),
                        "eval": res,
                        "eval_s": round(time.time() - t_ev),
                    }
                ),
                flush=True,
            )
            t0 += time.time() - t_ev  # eval time does not count as training time
            next_eval += args.eval_every
            if el >= args.minutes:
                break
        loss, n = batch_loss(model, rng.sample(train, args.batch))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        step += 1
        toks += n
        losses.append(loss.item())
        if step % 10 == 0:
            print(
                json.dumps(
                    {
                        "step": step,
                        "min": round((time.time() - t0) / 60, 2),
                        "loss": round(loss.item(), 3),
                        "tok_s": round(toks / (time.time() - t0)),
                    }
                ),
                flush=True,
            )


if __name__ == "__main__":
    main()
