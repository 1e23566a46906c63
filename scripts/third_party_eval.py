"""A third-party harness nobody here wrote evaluates the memory agent through our OpenAI-compatible endpoint, and
its per-item answers are compared with our own harness's on the same items (docs/third_party_eval.md).

The third-party harness is lm-evaluation-harness (lm-eval 0.4.13, unmodified), in an environment of its own built
from ``requirements/lm-eval.txt`` (pinned, hashed; not a dependency of this project). Its ``local-chat-completions``
model sends one chat request per item, as any OpenAI client would, to ``python -m taskutils.endpoint``, which runs the
memory loop (chunk by chunk memory overwrite, then the answer) with every turn sent to the upstream server. Our
harness (``python -m taskutils.memory_eval.run``, method ``memory``) runs the same loop in process against the same
upstream. Under greedy decoding the two final answers must be equal, item by item.

Steps, all offline on CPU:

1. the lm-eval environment (``.cache/venv-lmeval``): built with uv from the hashed requirements if absent;
2. a small RULER needle set made by our own tools (``python -m taskutils.memory_data ruler``), lengths measured
   with the model's tokenizer;
3. the upstream: ``transformers serve`` with the model (default: SmolLM2-135M-Instruct, shipped offline);
4. our endpoint in front of it, with the budgets and the final prompt of the harness's ``memory`` method;
5. lm-eval over the same JSON-lines file (a task YAML written at run time: ``dataset_path: json``), greedy,
   ``--apply_chat_template``, ``--log_samples``;
6. our harness over the same file, same budgets, greedy, against the same upstream;
7. the per-item comparison: printed, and written to ``<work>/comparison.md`` and ``comparison.json``.

    .venv/bin/python scripts/third_party_eval.py [--model smollm2-135m-instruct] [--items 6] [--length 1024]
        [--chunk 256 --max-new 64 --final-max-new 32] [--work .cache/third_party_eval]
    .venv/bin/python scripts/third_party_eval.py --setup-only   # step 1 alone (make setup)

Exit status: 0 when every item's two answers are equal, 1 when one differs or is missing, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from recurrent.local_server import free_port, health_probe, managed_server, transformers_serve  # noqa: E402
from recurrent.models import resolve_model_path  # noqa: E402
from recurrent.options import positive_int  # noqa: E402
from taskutils.memory_eval.results import results_path  # noqa: E402

LM_EVAL_VERSION = "0.4.13"
LM_EVAL_REQUIREMENTS = REPO / "requirements" / "lm-eval.txt"
DEFAULT_VENV = REPO / ".cache" / "venv-lmeval"
DEFAULT_WORK = REPO / ".cache" / "third_party_eval"
TASK_PREFIX = "memagent_"  # lm-eval task names: memagent_<RULER task>
# The user message lm-eval sends for an item: the document, a blank line, the question. The endpoint's default
# question mode cuts one message at its last blank line (docs/serving.md); RULER questions hold no blank line.
DOC_TO_TEXT = "{{context}}\n\n{{input}}"


# ---- the comparison: the part a test checks on hand-made files ---------------------------------------------------


@dataclass(frozen=True)
class ItemComparison:
    id: Any
    gold: list[str]
    third_party: str | None  # lm-eval's answer for the item (None: absent from its samples)
    ours: str | None  # our harness's final answer (None: absent, or the item failed)

    @property
    def equal(self) -> bool:
        return self.third_party is not None and self.third_party == self.ours


def lm_eval_answers(samples_file: Path) -> dict[Any, str]:
    """``item index -> answer`` from lm-eval's ``--log_samples`` file: each line holds the document it was asked
    about (``doc``, our item with its ``index``) and the model's raw answers (``resps``: one list per request, one
    string per repeat; a generation task asks once)."""
    answers = {}
    for line_no, line in enumerate(samples_file.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        sample = json.loads(line)
        item_id = sample["doc"]["index"]
        if item_id in answers:
            raise ValueError(f"{samples_file}:{line_no}: item {item_id!r} appears twice")
        answers[item_id] = sample["resps"][0][0]
    return answers


def harness_answers(results_file: Path) -> dict[Any, tuple[str | None, list[str]]]:
    """``item id -> (final answer, golds)`` from our harness's results file (one JSON line per item; a failed item
    has ``response: null`` and its ``error``)."""
    answers = {}
    for line in results_file.read_text(encoding="utf-8").splitlines():
        if line.strip():
            record = json.loads(line)
            answers[record["id"]] = (record["response"], record["gold"])
    return answers


def compare(third_party: dict[Any, str], ours: dict[Any, tuple[str | None, list[str]]]) -> list[ItemComparison]:
    """One row per item of either side, by item id (integers in order, then strings)."""
    ids = sorted(set(ours) | set(third_party), key=lambda i: (isinstance(i, str), i))
    return [ItemComparison(i, ours.get(i, (None, []))[1], third_party.get(i), ours.get(i, (None, []))[0]) for i in ids]


def _cell(text: str | None) -> str:
    if text is None:
        return "(missing)"
    return "`" + json.dumps(text, ensure_ascii=False)[1:-1].replace("`", "'").replace("|", "\\|") + "`"


def render_markdown(rows: list[ItemComparison]) -> str:
    """The per-item table (answers as JSON-escaped strings, so whitespace differences show) and the tally."""
    lines = [
        "| item | gold | lm-eval through the endpoint | our harness in process | equal |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        gold = ", ".join(row.gold) if row.gold else "-"
        equal = "yes" if row.equal else "**no**"
        lines.append(f"| {row.id} | {gold} | {_cell(row.third_party)} | {_cell(row.ours)} | {equal} |")
    equal = sum(row.equal for row in rows)
    lines.append("")
    lines.append(f"{equal} of {len(rows)} items: equal answers.")
    return "\n".join(lines)


# ---- the run ---------------------------------------------------------------------------------------------------


def shown(cmd: list[str], work: Path) -> str:
    """A command as the docs show it: the work folder as $WORK, the repository's interpreter as written in the
    README, no machine path."""
    text = shlex.join(cmd).replace(str(work), "$WORK").replace(sys.executable, ".venv/bin/python")
    return text.replace(str(REPO) + "/", "")


def run_logged(cmd: list[str], work: Path, log: list[str], **kwargs: Any) -> subprocess.CompletedProcess:
    """Run a command and record it (the comparison's output lists the exact commands)."""
    log.append(shown(cmd, work))
    print(f"$ {log[-1]}", flush=True)
    return subprocess.run(cmd, check=True, **kwargs)


def lm_eval_python(venv: Path) -> Path:
    """The lm-eval environment's interpreter; the environment is built (uv, hashed requirements, no other
    resolution) if lm-eval is not there at the pinned version, and synced again whenever the requirements file
    changed since it was installed (its hash is kept in the environment)."""
    python = venv / "bin" / "python"
    stamp = venv / "requirements.sha256"
    wanted = hashlib.sha256(LM_EVAL_REQUIREMENTS.read_bytes()).hexdigest()
    probe = [str(python), "-c", "import importlib.metadata as m; print(m.version('lm-eval'))"]
    installed = python.exists() and stamp.is_file() and stamp.read_text().strip() == wanted
    if installed and subprocess.run(probe, capture_output=True, text=True).stdout.strip() == LM_EVAL_VERSION:
        return python
    uv = Path(sys.executable).with_name("uv")
    uv_cmd = [str(uv)] if uv.exists() else [sys.executable, "-m", "uv"]
    print(f"building the lm-eval environment in {venv} from {LM_EVAL_REQUIREMENTS.relative_to(REPO)} ...", flush=True)
    if not python.exists():
        subprocess.run([*uv_cmd, "venv", "--quiet", "--python", sys.executable, str(venv)], check=True)
    # sync, not install: a package the requirements no longer name is removed, so the environment is the file's
    sync = ["pip", "sync", "--quiet", "--python", str(python), "--require-hashes"]
    subprocess.run([*uv_cmd, *sync, str(LM_EVAL_REQUIREMENTS)], check=True)
    stamp.write_text(wanted + "\n")
    return python


def write_task(folder: Path, task: str, data_file: Path, max_gen_toks: int) -> str:
    """An lm-eval task over our JSON-lines eval file: one chat request per item, greedy, no stop strings (the
    endpoint's answer turn runs to its own budget, as our harness's does)."""
    name = TASK_PREFIX + task
    config = {
        "task": name,
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(data_file)}},
        "test_split": "test",
        "output_type": "generate_until",
        "doc_to_text": DOC_TO_TEXT,
        "doc_to_target": "{{outputs[0]}}",
        "generation_kwargs": {"until": [], "max_gen_toks": max_gen_toks, "temperature": 0, "do_sample": False},
        # lm-eval's own score: the last number of the answer equals the needle (its built-in filters and metric)
        "filter_list": [
            {
                "name": "last_number",
                "filter": [
                    {"function": "regex", "regex_pattern": r"\d+", "group_select": -1},
                    {"function": "take_first"},
                ],
            },
        ],  # fmt: skip
        "metric_list": [{"metric": "exact_match", "aggregation": "mean", "higher_is_better": True}],
        "metadata": {"version": 1.0},
    }
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.yaml").write_text(json.dumps(config, indent=2) + "\n")  # JSON is YAML
    return name


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python scripts/third_party_eval.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--model", default="smollm2-135m-instruct", help="an offline model (default: %(default)s)")
    parser.add_argument("--task", default="niah_single_1", help="RULER task (default: %(default)s)")
    parser.add_argument("--length", type=positive_int, default=1024, help="RULER length in tokens (default 1024)")
    parser.add_argument("--items", type=positive_int, default=6, help="items (default 6)")
    parser.add_argument("--chunk", type=positive_int, default=256, help="context tokens per chunk (default 256)")
    parser.add_argument("--max-new", type=positive_int, default=64, help="memory cap, new tokens (default 64)")
    parser.add_argument("--final-max-new", type=positive_int, default=32, help="answer cap, new tokens (default 32)")
    parser.add_argument(
        "--concurrent", type=positive_int, default=2, help="requests in flight, lm-eval and our harness (default 2)"
    )
    parser.add_argument("--work", type=Path, default=DEFAULT_WORK, help="work folder (.cache/third_party_eval)")
    parser.add_argument("--venv", type=Path, default=DEFAULT_VENV, help="lm-eval environment (.cache/venv-lmeval)")
    parser.add_argument(
        "--setup-only", action="store_true", help="build the lm-eval environment and stop (make setup runs this)"
    )
    return parser


def make_data(args: argparse.Namespace, work: Path, model_dir: str, log: list[str], env: dict[str, str]) -> Path:
    """A small RULER set made by our own tools (step 2), lengths measured with the model's tokenizer."""
    data = work / "data"
    make_data = [
        sys.executable, "-m", "taskutils.memory_data", "ruler", "--out", str(data), "--tasks", args.task,
        "--lengths", str(args.length), "--tokenizer", str(model_dir), "--num-samples", str(args.items),
    ]  # fmt: skip
    run_logged(make_data, work, log, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return data / f"eval_{args.task}_{args.length}.jsonl"


def write_table(args: argparse.Namespace, work: Path, model_dir: str) -> Path:
    """Our harness's model table: the model with the budgets the endpoint gets."""
    table = work / "table.yaml"
    table.write_text(
        "models:\n"
        f"  - name: {args.model}\n"
        f"    checkpoint: {model_dir}\n"
        "    method: memory\n"
        f"    concurrency: {args.concurrent}\n"
        f"    memory: {{chunk_size: {args.chunk}, max_new: {args.max_new}, final_max_new: {args.final_max_new}}}\n"
    )
    return table


def run_both(
    args: argparse.Namespace,
    work: Path,
    model_dir: str,
    lm_python: Path,
    task: str,
    table: Path,
    log: list[str],
    env: dict[str, str],
) -> None:
    """Steps 3 to 6: the upstream, our endpoint in front of it with lm-eval through it, then our harness against the
    same upstream."""
    print(f"starting the upstream: transformers serve {args.model} ...", flush=True)
    with transformers_serve(model_dir, log_path=work / "logs" / "upstream.log") as upstream:
        port = free_port()
        endpoint_cmd = [
            sys.executable, "-m", "taskutils.endpoint", "--upstream", upstream.base_url, "--model", upstream.model,
            "--served-model-name", args.model, "--tokenizer", str(model_dir), "--chunk-size", str(args.chunk),
            "--max-new", str(args.max_new), "--final-max-new", str(args.final_max_new),
            "--max-documents", str(args.concurrent), "--port", str(port),
        ]  # fmt: skip
        log.append(shown(endpoint_cmd, work))
        print(f"$ {log[-1]}", flush=True)
        ready = health_probe(f"http://127.0.0.1:{port}/health")
        with managed_server(endpoint_cmd, ready, work / "logs" / "endpoint.log", 300, 0.2, env=env):
            lm_env = {**env, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_DATASETS_CACHE": str(work / "hf")}
            model_args = (
                f"model={args.model},base_url=http://127.0.0.1:{port}/v1/chat/completions,"
                f"num_concurrent={args.concurrent},max_retries=1,timeout=1200,tokenized_requests=False"
            )
            lm_eval = [
                str(lm_python), "-m", "lm_eval", "run", "--model", "local-chat-completions",
                "--model_args", model_args, "--tasks", task, "--include_path", str(work / "tasks"),
                "--apply_chat_template", "--log_samples", "--output_path", str(work / "lm_eval"),
            ]  # fmt: skip
            run_logged(lm_eval, work, log, cwd=work, env=lm_env)
        harness = [
            sys.executable, "-m", "taskutils.memory_eval.run", "--table", str(table),
            "--models", args.model, "--tasks", args.task, "--lengths", str(args.length), "--data-dir",
            str(work / "data"), "--method", "memory", "--temperature", "0", "--url", upstream.base_url,
            "--served-model", upstream.model, "--results-dir", str(work / "harness"), "--no-report", "--quiet",
        ]  # fmt: skip
        run_logged(harness, work, log, cwd=REPO, env=env)


def write_comparison(args: argparse.Namespace, work: Path, task: str, log: list[str], began: float) -> int:
    """Step 7: the per-item comparison, printed and written; 0 when every item's two answers are equal."""
    samples = sorted((work / "lm_eval").rglob(f"samples_{task}_*.jsonl"))
    if len(samples) != 1:
        print(f"error: expected one lm-eval samples file, found {samples}", file=sys.stderr)
        return 1
    ours = results_path(work / "harness", args.task, args.length, args.model, "memory")
    rows = compare(lm_eval_answers(samples[0]), harness_answers(ours))
    (lm_results,) = (work / "lm_eval").rglob("results_*.json")
    lm_score = json.loads(lm_results.read_text())["results"][task]["exact_match,last_number"]
    records = [json.loads(line) for line in ours.read_text().splitlines() if line.strip()]
    our_score = sum(r["sub_em"] for r in records) / len(records)
    table_md = "\n".join(
        [
            render_markdown(rows),
            "",
            f"Scores, each harness by its own rule: lm-eval {lm_score:.3f} (exact_match of the answer's last number "
            f"against the needle, the task's filter); our harness {our_score:.3f} (sub_em: RULER match_all of the "
            "'the answer is' extraction, the paper's protocol).",
        ]
    )
    print("\n" + table_md)
    summary = {
        "model": args.model,
        "task": args.task,
        "length": args.length,
        "budgets": {"chunk": args.chunk, "max_new": args.max_new, "final_max_new": args.final_max_new},
        "lm_eval_version": LM_EVAL_VERSION,
        "commands": log,
        "seconds": round(time.perf_counter() - began, 1),
        "scores": {"lm_eval_exact_match_last_number": lm_score, "harness_sub_em": our_score},
        "items": [{**asdict(row), "equal": row.equal} for row in rows],
    }
    (work / "comparison.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
    shown_commands = "\n".join(f"$ {c}" for c in log)
    (work / "comparison.md").write_text(f"{table_md}\n\n```text\n{shown_commands}\n```\n")
    print(f"\n{summary['seconds']} s in all; {work / 'comparison.md'}")
    return 0 if rows and all(row.equal for row in rows) else 1


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.setup_only:
        print(f"lm-eval {LM_EVAL_VERSION}: {lm_eval_python(args.venv.resolve())}")
        return 0
    work = args.work.resolve()
    shutil.rmtree(work, ignore_errors=True)  # a fresh data set, fresh results: nothing resumed from another run
    work.mkdir(parents=True)
    model_dir = resolve_model_path(args.model)
    commands: list[str] = []
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    began = time.perf_counter()
    lm_python = lm_eval_python(args.venv.resolve())
    data_file = make_data(args, work, model_dir, commands, env)
    task = write_task(work / "tasks", args.task, data_file, args.final_max_new)
    table = write_table(args, work, model_dir)
    run_both(args, work, model_dir, lm_python, task, table, commands, env)
    return write_comparison(args, work, task, commands, began)


if __name__ == "__main__":
    sys.exit(main())
