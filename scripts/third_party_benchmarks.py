"""LongBench-QA and BABILong as lm-evaluation-harness defines them, run against the memory agent behind our endpoint,
beside our harness on the same items: per item, both answers and both scores (docs/third_party_eval.md,
"LongBench-QA and BABILong").

lm-eval 0.4.13's own tasks (``longbench_<subset>``, ``babilong_qa<N>``: their prompts, their metric functions) are
included unchanged by a task file written at run time that swaps only their data source for a local file in the
published format (the first ``--items`` records of ``THUDM/LongBench``'s ``data/<subset>.jsonl`` and of
``RMT-team/babilong``'s ``data/qa<N>/<config>.json``). Two adaptations, both about data, none about prompts or
metrics: lm-eval reads LongBench from a copy whose question field is ``question`` where the published files say
``input`` (a ``process_docs`` copies it), and its BABILong tasks load their data in code (``custom_dataset``, set to
none here so that the local file is read). ``--gen_kwargs temperature=0,max_gen_toks=N``: greedy, as the tasks mean
(their ``do_sample: false``; LongBench's ``temperature: 1`` would reach the endpoint as sampling) and one answer
budget for both harnesses.

``--prompt task`` (default) keeps the tasks' prompts: LongBench's instructions around the document and
``Question: ...\\nAnswer:`` after the last blank line (where the endpoint's default rule finds the question), BABILong's
two examples before the document (its description is a system message, which the endpoint does not read) and the
question on the last line (the endpoint is started with ``--split-marker '\\n'``). Our harness reads the bare document
and question, so the memory agent reads other text on the two routes: the comparison says, item by item, what the
task's prompt added. ``--prompt harness`` replaces the tasks' ``doc_to_text`` by the document, a blank line and the
question (no examples, no description): both routes then read the same text, and answers and scores must be equal.

    .venv/bin/python scripts/third_party_benchmarks.py [--model smollm2-135m-instruct] [--items 2] [--prompt task]
        [--sources DIR (downloaded files; default: the small samples below, in the published formats)]

Exit status: 0 when every item's two scores are equal (``--prompt harness``: and the answers), 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

import third_party_eval as tpe  # noqa: E402

from recurrent.local_server import free_port, health_probe, managed_server, transformers_serve  # noqa: E402
from recurrent.models import resolve_model_path  # noqa: E402
from recurrent.options import positive_int  # noqa: E402
from taskutils.memory_data.benchmarks import babilong_source, longbench_source  # noqa: E402
from taskutils.memory_eval.results import results_path  # noqa: E402

# The two tasks run: (our task, lm-eval's task, its metric key in the samples).
LONGBENCH = ("longbench_hotpotqa", "longbench_hotpotqa", "score")
BABILONG = ("babilong_qa1", "babilong_qa1", "acc")
HARNESS_TEXT = {"longbench_hotpotqa": "{{context}}\n\n{{input}}", "babilong_qa1": "{{input}}\n\n{{question}}"}

# Small samples in the published formats (hand-written: no data set is downloaded at run time).
LONGBENCH_SAMPLE = [
    {
        "input": "Which city is the home of the observatory that Maria Kirch visited?",
        "context": "Passage 1:\nMaria Kirch was an astronomer. In 1702 she visited the observatory of Berlin and "
        "worked there for many years, computing calendars for the academy.\nPassage 2:\nThe Berlin observatory was "
        "founded by the Prussian Academy of Sciences. It moved several times within the city of Berlin.\nPassage "
        "3:\nGottfried Kirch, her husband, was the first astronomer of the academy.",
        "answers": ["Berlin"],
        "length": 63,
        "dataset": "hotpotqa",
        "language": "en",
        "all_classes": None,
        "_id": "0d0f0e1c2b3a49586776655443322110",
    },
    {
        "input": "Who wrote the play that the Globe Theatre staged first?",
        "context": "Passage 1:\nThe Globe Theatre was built in 1599 in London. Its first staged play is believed "
        "to have been Julius Caesar.\nPassage 2:\nJulius Caesar is a tragedy written by William Shakespeare, "
        "first performed in 1599.\nPassage 3:\nThe theatre burned down in 1613 during a performance.",
        "answers": ["William Shakespeare", "Shakespeare"],
        "length": 52,
        "dataset": "hotpotqa",
        "language": "en",
        "all_classes": None,
        "_id": "9a8b7c6d5e4f30211203948576afbecd",
    },
]
BABILONG_SAMPLE = [
    {
        "input": "Mary moved to the bathroom. John went to the hallway. Mary travelled to the kitchen.",
        "question": "Where is Mary?",
        "target": "kitchen",
    },
    {
        "input": "Daniel went back to the garden. Sandra journeyed to the office. Daniel moved to the bedroom.",
        "question": "Where is Daniel?",
        "target": "bedroom",
    },
]


def write_samples(sources: Path) -> None:
    """The hand-written samples where the download puts the published files, in their formats."""
    lb, bl = longbench_source(sources, "hotpotqa"), babilong_source(sources, "qa1", "0k")
    lb.parent.mkdir(parents=True, exist_ok=True)
    bl.parent.mkdir(parents=True, exist_ok=True)
    lb.write_text("".join(json.dumps(r) + "\n" for r in LONGBENCH_SAMPLE))
    bl.write_text(json.dumps(BABILONG_SAMPLE, indent=2) + "\n")


def first_records(sources: Path, items: int, folder: Path) -> dict[str, Path]:
    """lm-eval's local data: the first ``items`` records of each published file, in its own format."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = longbench_source(sources, "hotpotqa").read_text(encoding="utf-8").splitlines()
    lb = folder / "hotpotqa.jsonl"
    lb.write_text("".join(line + "\n" for line in [x for x in lines if x.strip()][:items]), encoding="utf-8")
    bl = folder / "qa1_0k.json"
    records = json.loads(babilong_source(sources, "qa1", "0k").read_text(encoding="utf-8"))
    bl.write_text(json.dumps(records[:items], ensure_ascii=False) + "\n", encoding="utf-8")
    return {"longbench_hotpotqa": lb, "babilong_qa1": bl}


def write_tasks(folder: Path, lm_tasks: Path, data: dict[str, Path], prompt: str) -> None:
    """Our task files: lm-eval's own task included, its data source swapped (and with ``prompt == "harness"``
    its text)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "memagent_utils.py").write_text(
        "def question_from_input(dataset):\n"
        "    # the published LongBench files name the question 'input'; lm-eval's copy names it 'question'\n"
        "    return dataset.map(lambda doc: {'question': doc['input']})\n"
    )
    longbench = [
        f"include: {lm_tasks / 'longbench' / 'hotpotqa.yaml'}",
        "task: memagent_longbench_hotpotqa",
        "tag: []",
        "dataset_path: json",
        "dataset_name: null",
        f"dataset_kwargs: {{data_files: {{test: {json.dumps(str(data['longbench_hotpotqa']))}}}}}",
        "process_docs: !function memagent_utils.question_from_input",
    ]
    babilong = [
        f"include: {lm_tasks / 'babilong' / 'babilong_qa1.yaml'}",
        "task: memagent_babilong_qa1",
        "custom_dataset: null",
        "dataset_path: json",
        f"dataset_kwargs: {{data_files: {{qa1: {json.dumps(str(data['babilong_qa1']))}}}}}",
    ]
    if prompt == "harness":
        longbench.append(f"doc_to_text: {json.dumps(HARNESS_TEXT['longbench_hotpotqa'])}")
        babilong += [f"doc_to_text: {json.dumps(HARNESS_TEXT['babilong_qa1'])}", 'description: ""', "num_fewshot: 0"]
    (folder / "memagent_longbench_hotpotqa.yaml").write_text("\n".join(longbench) + "\n")
    (folder / "memagent_babilong_qa1.yaml").write_text("\n".join(babilong) + "\n")


def lm_eval_samples(samples_file: Path, metric: str) -> dict[int, dict[str, Any]]:
    """``doc_id -> {answer, score, sent}`` from lm-eval's ``--log_samples`` file (``sent``: the user message)."""
    out = {}
    for line in samples_file.read_text(encoding="utf-8").splitlines():
        if line.strip():
            sample = json.loads(line)
            (request,) = sample["arguments"]["gen_args_0"]["arg_0"]
            messages = json.loads(request)
            sent = "\n\n".join(m["content"] for m in messages if m["role"] == "user")
            score = round(float(sample[metric]), 4)  # as our harness records it
            out[sample["doc_id"]] = {"answer": sample["resps"][0][0], "score": score, "sent": sent}
    return out


def compare_rows(lm: dict[int, dict[str, Any]], ours_file: Path, data_file: Path) -> list[dict[str, Any]]:
    """One row per item: both answers and scores, and how many characters lm-eval's user message held beyond our
    item's document, a blank line and its question (what the task's prompt added)."""
    items = {json.loads(x)["index"]: json.loads(x) for x in data_file.read_text().splitlines() if x.strip()}
    records = {json.loads(x)["id"]: json.loads(x) for x in ours_file.read_text().splitlines() if x.strip()}
    rows = []
    for index in sorted(set(items) | set(lm)):
        mine, theirs, item = records.get(index, {}), lm.get(index, {}), items.get(index, {})
        bare = len(item.get("context", "")) + len("\n\n") + len(item.get("input", ""))  # document, blank line, question
        rows.append(
            {
                "id": index,
                "gold": mine.get("gold"),
                "lm_eval_answer": theirs.get("answer"),
                "our_answer": mine.get("response"),
                "lm_eval_score": theirs.get("score"),
                "our_score": mine.get("bench"),
                "prompt_added_chars": len(theirs.get("sent", "")) - bare if theirs else None,
            }
        )
    return rows


def render(task: str, rows: list[dict[str, Any]]) -> str:
    lines = [
        f"### {task}",
        "",
        "| item | gold | lm-eval through the endpoint | its score | our harness | our score | prompt added (chars) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        gold = ", ".join(r["gold"] or []) or "-"
        cells = [tpe._cell(r["lm_eval_answer"]), str(r["lm_eval_score"]), tpe._cell(r["our_answer"])]
        lines.append(
            f"| {r['id']} | {gold} | " + " | ".join([*cells, str(r["our_score"]), str(r["prompt_added_chars"])]) + " |"
        )
    equal = sum(r["lm_eval_score"] is not None and r["lm_eval_score"] == r["our_score"] for r in rows)
    same = sum(r["lm_eval_answer"] is not None and r["lm_eval_answer"] == r["our_answer"] for r in rows)
    return "\n".join([*lines, "", f"{equal} of {len(rows)} items: equal scores; {same} of {len(rows)}: equal answers."])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python scripts/third_party_benchmarks.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--model", default="smollm2-135m-instruct", help="an offline model (default: %(default)s)")
    parser.add_argument("--items", type=positive_int, default=2, help="items per benchmark (default 2)")
    parser.add_argument("--prompt", choices=("task", "harness"), default="task", help="lm-eval's text (see above)")
    parser.add_argument("--sources", type=Path, help="downloaded sources (default: the small samples)")
    parser.add_argument("--chunk", type=positive_int, default=128, help="context tokens per chunk (default 128)")
    parser.add_argument("--max-new", type=positive_int, default=32, help="memory cap, new tokens (default 32)")
    parser.add_argument("--final-max-new", type=positive_int, default=16, help="answer cap (default 16)")
    parser.add_argument("--work", type=Path, default=REPO / ".cache" / "third_party_benchmarks", help="work folder")
    parser.add_argument("--venv", type=Path, default=tpe.DEFAULT_VENV, help="lm-eval environment")
    return parser


def run_lm_eval(
    args, work: Path, lm_python: Path, task: str, upstream, model_dir: str, log: list[str], env: dict[str, str]
) -> Path:
    """lm-eval over one task through our endpoint in front of ``upstream``; its samples file."""
    port = free_port()
    endpoint = [
        sys.executable, "-m", "taskutils.endpoint", "--upstream", upstream.base_url, "--model", upstream.model,
        "--served-model-name", args.model, "--tokenizer", str(model_dir), "--chunk-size", str(args.chunk),
        "--max-new", str(args.max_new), "--final-max-new", str(args.final_max_new), "--port", str(port),
    ]  # fmt: skip
    if task.startswith("babilong") and args.prompt == "task":
        endpoint += ["--question-mode", "split", "--split-marker", "\n"]  # the question is the last line
    log.append(tpe.shown(endpoint, work))
    ready = health_probe(f"http://127.0.0.1:{port}/health")
    with managed_server(endpoint, ready, work / "logs" / f"endpoint_{task}.log", 300, 0.2, env=env):
        model_args = (
            f"model={args.model},base_url=http://127.0.0.1:{port}/v1/chat/completions,num_concurrent=1,"
            "max_retries=1,timeout=1200,tokenized_requests=False"
        )
        lm_env = {**env, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_DATASETS_CACHE": str(work / "hf")}
        cmd = [
            str(lm_python), "-m", "lm_eval", "run", "--model", "local-chat-completions", "--model_args", model_args,
            "--tasks", f"memagent_{task}", "--include_path", str(work / "tasks"), "--apply_chat_template",
            "--gen_kwargs", f"temperature=0,max_gen_toks={args.final_max_new}", "--log_samples",
            "--output_path", str(work / "lm_eval"),
        ]  # fmt: skip
        tpe.run_logged(cmd, work, log, cwd=work, env=lm_env)
    (samples,) = sorted((work / "lm_eval").rglob(f"samples_memagent_{task}_*.jsonl"))
    return samples


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    work = args.work.resolve()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    began, log = time.perf_counter(), []
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    model_dir = resolve_model_path(args.model)
    lm_python = tpe.lm_eval_python(args.venv.resolve())
    sources = args.sources.resolve() if args.sources else work / "sources"
    if args.sources is None:
        write_samples(sources)
    data = work / "data"
    for stage in (["longbench", "--subsets", "hotpotqa"], ["babilong", "--tasks", "qa1", "--configs", "0k"]):
        cmd = [sys.executable, "-m", "taskutils.memory_data", *stage, "--out", str(data), "--sources", str(sources)]
        tpe.run_logged([*cmd, "--num-samples", str(args.items)], work, log, cwd=REPO, env=env)
    site = subprocess.run(
        [str(lm_python), "-c", "import lm_eval, pathlib; print(pathlib.Path(lm_eval.__file__).parent)"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    write_tasks(work / "tasks", Path(site) / "tasks", first_records(sources, args.items, work / "lm_data"), args.prompt)
    table = tpe.write_table(argparse.Namespace(**{**vars(args), "concurrent": 1}), work, model_dir)
    samples = {}
    with transformers_serve(model_dir, log_path=work / "logs" / "upstream.log") as upstream:
        for task, _, _ in (LONGBENCH, BABILONG):
            samples[task] = run_lm_eval(args, work, lm_python, task, upstream, model_dir, log, env)
        harness = [
            sys.executable, "-m", "taskutils.memory_eval.run", "--table", str(table), "--models", args.model,
            "--tasks", "longbench_hotpotqa,babilong_qa1", "--lengths", "0", "--data-dir", str(data), "--method",
            "memory", "--temperature", "0", "--url", upstream.base_url, "--served-model", upstream.model,
            "--results-dir", str(work / "harness"), "--no-report", "--quiet",
        ]  # fmt: skip
        tpe.run_logged(harness, work, log, cwd=REPO, env=env)
    parts, summary, ok = [], {"prompt": args.prompt, "commands": log, "tasks": {}}, True
    for task, _, metric in (LONGBENCH, BABILONG):
        ours = results_path(work / "harness", task, 0, args.model, "memory")
        rows = compare_rows(lm_eval_samples(samples[task], metric), ours, data / f"eval_{task}_0.jsonl")
        parts.append(render(task, rows))
        summary["tasks"][task] = rows
        ok &= all(r["lm_eval_score"] is not None and r["lm_eval_score"] == r["our_score"] for r in rows)
        if args.prompt == "harness":
            ok &= all(r["lm_eval_answer"] == r["our_answer"] for r in rows)
    summary["seconds"] = round(time.perf_counter() - began, 1)
    text = "\n\n".join(parts)
    print("\n" + text)
    (work / "comparison.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
    commands = "\n".join(f"$ {c}" for c in log)
    (work / "comparison.md").write_text(f"{text}\n\n```text\n{commands}\n```\n")
    print(f"\n{summary['seconds']} s in all; {work / 'comparison.md'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
