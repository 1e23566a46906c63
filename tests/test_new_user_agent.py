"""What a new user does with docs/write_your_own_agent.md, in a folder of their own outside the repository: serve a
local model with the page's command and try the page's agent against it, evaluate it through the harness with its
settings from a file (``--agent-config``) on the page's data; then write an agent of their own (not the page's: a
draft, then a check of the draft, its prompts in a module beside it), try it with the quickstart, evaluate it through
the harness by its path, serve it by its path and stream it, check it with the page's preflight command, train it
for 2 steps with the page's training command, then read the run's rows with the page's rows tool. Every command is
run as the page writes it, from the user's folder, with the repository elsewhere; the "model" behind the
OpenAI-compatible server is scripted (tests/scripted_calculator.py's way) except the local server's, training uses
the tiny offline model."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from aiohttp import web
from openai import OpenAI
from threaded_http import serve_in_a_thread

from experiments.calculator.task import write
from recurrent.local_server import free_port, wait_ready
from recurrent.models import load_tokenizer
from recurrent.templating import chat_prompt_ids

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "write_your_own_agent.md"
TRAIN_TIMEOUT_S = 1500  # 2 steps of 4 problems x 4 trajectories x 2 calls with the tiny model (~3-6 min on 2 cores)

pytestmark = [pytest.mark.trainer, pytest.mark.slow(seconds=300), pytest.mark.timeout(2400)]

# The user's agent: two calls, a draft and a check of it; the check's reply is the answer. Its prompts live in a
# module beside it, imported as the page says (the file's folder is on the path wherever it runs).
PROMPTS = r"""
DRAFT = "{question}\nWrite a short draft answer."
CHECK = "Question: {question}\nDraft answer: {draft}\nCheck the draft and put the final answer in \\boxed{{}}."
"""
AGENT = r'''
from dataclasses import dataclass

from prompts import CHECK, DRAFT

from recurrent.functions import agent_function
from recurrent.interface import WorkflowConfig


@dataclass
class DraftCheckConfig(WorkflowConfig):
    max_tokens: int = 32  # new tokens per call


async def draft_then_check(sample, client, config):
    """A draft, then a check of it: the check's reply is the answer."""
    question = sample["input"]
    draft = await client.chat([{"role": "user", "content": DRAFT.format(question=question)}], config.max_tokens)
    check = CHECK.format(question=question, draft=draft.text)
    final = await client.chat([{"role": "user", "content": check}], config.max_tokens)
    return final.text


REGISTER = agent_function("draft_check", DraftCheckConfig, draft_then_check, columns=("input",))
'''
DRAFT = "{question}\nWrite a short draft answer."
CHECK = "Question: {question}\nDraft answer: {draft}\nCheck the draft and put the final answer in \\boxed{{}}."
QUESTION = re.compile(r"What is (\d+) ([-+*]) (\d+)\?")


def block(language: str, starts: str = "") -> str:
    """The page's first ``language`` block that starts with ``starts``."""
    blocks = re.findall(rf"```{language}\n(.*?)```", PAGE.read_text(), flags=re.DOTALL)
    return next(b for b in blocks if b.startswith(starts))


def scripted_app(seen: list[str], caps: list[int] | None = None) -> web.Application:
    """The "model": a draft prompt gets "Draft: <result>", a check prompt gets the result boxed; ``caps`` gets each
    request's max_tokens."""

    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        content = body["messages"][-1]["content"]
        seen.append(content)
        if caps is not None:
            caps.append(body["max_tokens"])
        a, op, b = QUESTION.search(content).groups()
        result = {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op]
        text = f"\\boxed{{{result}}}" if "Check the draft" in content else f"Draft: {result}"
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
        usage = {"prompt_tokens": 10, "completion_tokens": 4, "total_tokens": 14}
        return web.json_response(
            {"id": "x", "object": "chat.completion", "model": body["model"], "choices": [choice], "usage": usage}
        )

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/v1/models", lambda _: web.json_response({"object": "list", "data": [{"id": "m"}]}))
    return app


def train_as_user(command: str, user: Path) -> None:
    """Run a documented training command in the user's folder as a user would (the CPU platform not preset),
    its output in ``user/train.log``; a run past the time limit is stopped through the launcher's trap."""
    env = {**user_env(), "PYTHON": sys.executable}
    env.pop("VERL_PLATFORM", None)
    log_path = user / "train.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(
            ["bash", "-c", command], cwd=user, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            rc = process.wait(TRAIN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGTERM)  # the launcher's trap ends the trainer's session
            process.wait(60)
            rc = -1
    assert rc == 0, log_path.read_text()[-5000:]


def user_env() -> dict[str, str]:
    """The user's shell: the project installed (here: this checkout first on the path), one thread a process."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}


def run(command: str, cwd: Path, timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
    """A command line of the page (``python`` is the project's interpreter), run by bash in the user's folder."""
    command = re.sub(r"^python ", f"{sys.executable} ", command.strip())
    command = re.sub(r"(\bbash|&&) python ", rf"\1 {sys.executable} ", command)
    done = subprocess.run(
        ["bash", "-c", command],
        cwd=cwd,
        env={**user_env(), **env},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, f"{command}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def problems_frame(questions: list[tuple[str, int]]) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "prompt": [{"role": "user", "content": q}],
                "input": q,
                "data_source": "arithmetic",
                "reward_model": {"ground_truth": str(a)},
            }
            for q, a in questions
        ]
    )


@pytest.fixture(scope="module")
def user(tmp_path_factory, tiny_model_dir) -> Path:
    """The user's folder, outside the repository: the agent file, its run config, its data."""
    folder = tmp_path_factory.mktemp("new_user")
    assert REPO not in folder.parents
    (folder / "my_agent.py").write_text(AGENT)
    (folder / "prompts.py").write_text(PROMPTS)
    # The page's run config with this agent's settings in place of the page's agent's.
    config = block("yaml", "# my_agent_cpu.yaml")
    page_settings = re.search(r"  config:\n((?:    .*\n)+)", config)
    assert page_settings, config
    (folder / "my_agent_cpu.yaml").write_text(config.replace(page_settings.group(1), "    max_tokens: 32\n"))
    (folder / "data").mkdir()
    train = [(f"What is {a} + {b}?", a + b) for a, b in ((12, 30), (7, 8), (21, 21), (40, 2), (5, 9), (33, 11))]
    problems_frame(train).to_parquet(folder / "data" / "train.parquet")
    problems_frame(train[:2]).to_parquet(folder / "data" / "validation.parquet")
    return folder


def python_block(starts: str) -> str:
    """The page's first Python block that starts with ``starts``."""
    return block("python", starts)


def test_serve_a_local_model_try_the_pages_agent_and_evaluate_it_with_its_settings(user: Path):
    page = user / "page"  # the page's own agent, in a folder of its own
    page.mkdir()
    (page / "my_agent.py").write_text(python_block("# my_agent.py"))
    (page / "insist.json").write_text('{"max_tries": 2}')
    command = block("sh", "python -m recurrent.local_server").strip()
    assert "--model tiny" in command
    port = free_port()
    line = re.sub(r"--port \d+", f"--port {port}", command).replace("python ", f"{sys.executable} ", 1)
    log = (page / "server.log").open("w")
    process = subprocess.Popen(
        ["bash", "-c", f"exec {line}"], cwd=page, env=user_env(), stdout=subprocess.PIPE, stderr=log, text=True
    )
    try:
        announced = dict(process.stdout.readline().strip().split("=", 1) for _ in range(2))  # URL=..., MODEL=...
        url, model = announced["URL"], announced["MODEL"]
        assert url == f"http://127.0.0.1:{port}/v1"
        client = OpenAI(base_url=url, api_key="unused", max_retries=0)
        client.models.list()  # /v1/models answers
        ask = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
        greedy = {client.chat.completions.create(**ask, temperature=0).choices[0].message.content for _ in range(2)}
        sampled = {client.chat.completions.create(**ask, temperature=1.5).choices[0].message.content for _ in range(4)}
        assert len(greedy) == 1 and len(sampled) > 1  # it samples at the temperature asked for

        # The page's try block against it, from the page's folder.
        try_it = f"URL = {url!r}\nMODEL = {model!r}\n" + python_block("import asyncio\n\nfrom recurrent.async_manager")
        printed = run(f"python -c {shlex.quote(try_it)}", page).stdout.splitlines()
        calls = [line for line in printed if "messages ->" in line]
        assert 1 <= len(calls) <= 3 and printed[-1].startswith("answer: "), printed

        # The page's data, and its harness command with the agent's settings from a file: at most 2 tries a
        # question (the random model never boxes, so every item takes both).
        run(f"python -c {shlex.quote(python_block('import json'))}", page)
        harness = block("sh", "python -m taskutils.memory_eval.run").strip().replace("URL", url).replace("MODEL", model)
        assert "--agent-config insist.json" in harness and "--method my_agent.py" in harness
        run(harness + " --no-report --quiet", page)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(60)
        log.close()
    results = [json.loads(x) for x in (page / "results" / "arith_1" / "tiny__my_agent.jsonl").open()]
    assert len(results) == 4 and all(r["method"] == "my_agent" and r["error"] is None for r in results)
    assert {r["turns"] for r in results} == {2}  # max_tries from insist.json, not the agent's default 3


def test_check_it_with_the_preflight_command(user: Path):
    command = re.search(r"`(python -m verl_ext\.preflight [^`]*)`", PAGE.read_text().replace("\n", " ")).group(1)
    done = run(command, user)  # the page's data paths are this folder's: data/train.parquet, ...
    assert f"[memagent] ready: {(user / 'my_agent.py').resolve()} (my_agent_cpu.yaml)" in done.stdout


def test_try_it_with_the_quickstart(user: Path):
    seen: list[str] = []
    command = re.search(r"`(URL=\.\.\. python \S*quickstart\.py [^`]*)`", PAGE.read_text().replace("\n", " "))
    assert command, "the page's quickstart command"
    line = command.group(1).replace("URL=... ", "").replace("REPO/", f"{REPO}/").replace("MODEL", "m")
    line = line.replace('"..."', '"What is 6 * 7?"')
    with serve_in_a_thread(scripted_app(seen), wait_s=30) as url:
        done = run(line, user, URL=url)
    assert "agent: draft_check (my_agent.py)" in done.stdout and done.stdout.count("\n--- call (") == 2
    assert "\nAnswer: 42\n" in done.stdout
    assert seen == [DRAFT.format(question="What is 6 * 7?"), CHECK.format(question="What is 6 * 7?", draft="Draft: 42")]


def test_evaluate_it_through_the_harness_by_its_path(user: Path, tiny_model_dir):
    write(user / "evaldata", {"test": 4}, seed=0)
    (user / "eval_settings.yaml").write_text("max_tokens: 20\n")
    seen: list[str] = []
    caps: list[int] = []
    with serve_in_a_thread(scripted_app(seen, caps), wait_s=30) as url:
        table = {"models": [{"name": "scripted", "checkpoint": tiny_model_dir, "url": url, "served_name": "m"}]}
        (user / "models.yaml").write_text(yaml.safe_dump(table))
        options = "--table models.yaml --models scripted --tasks calculator --lengths 2"
        options += " --data-dir evaldata/eval/test --results-dir results --no-report --quiet"
        options += " --agent-config eval_settings.yaml"
        run(f"python -m taskutils.memory_eval.run --method my_agent.py {options}", user)
    lines = [json.loads(x) for x in (user / "results" / "calculator_2" / "scripted__my_agent.jsonl").open()]
    assert len(lines) == 4 and len(seen) == 8 and caps == [20] * 8  # the file's max_tokens, not the default 32
    assert all(x["method"] == "my_agent" and x["turns"] == 2 and x["strict"] == 1 and x["error"] is None for x in lines)


def test_serve_it_by_its_path_and_stream_it(user: Path):
    (user / "draft.json").write_text('{"max_tokens": 24}')
    command = block("sh", "python -m taskutils.endpoint")
    assert "--agent my_agent.py --agent-config insist.json" in command
    seen: list[str] = []
    with serve_in_a_thread(scripted_app(seen), wait_s=30) as url:
        port = free_port()
        line = command.strip().replace("insist.json", "draft.json").replace("URL", url).replace("MODEL", "m")
        line = line.replace("python ", f"{sys.executable} ", 1) + f" --port {port}"
        log = (user / "serve.log").open("w")
        process = subprocess.Popen(
            ["bash", "-c", f"exec {line}"], cwd=user, env=user_env(), stdout=log, stderr=subprocess.STDOUT
        )
        try:
            base = f"http://127.0.0.1:{port}/v1"
            client = OpenAI(base_url=base, api_key="unused", max_retries=0)

            def answers() -> str | None:
                try:
                    client.models.list()
                except Exception as err:
                    return str(err)
                return None

            wait_ready(answers, process, 180, 0.2, user / "serve.log", "python -m taskutils.endpoint")
            stream = client.chat.completions.create(
                model="m",
                messages=[{"role": "user", "content": "What is 37 + 48?"}],
                stream=True,
                extra_body={"memagent": {"progress": True}},
            )
            chunks = list(stream)
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(60)
            log.close()
    progress = [c.model_extra["memagent"] for c in chunks if not c.choices and "memagent" in (c.model_extra or {})]
    answer = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert [(p["agent"], p["call"], p["finish_reason"]) for p in progress] == [
        ("draft_check", 1, "stop"),
        ("draft_check", 2, "stop"),
    ]
    assert answer == "\\boxed{85}" and len(seen) == 2
    assert "agent 'draft_check' (DraftCheckConfig: max_tokens=24)" in (user / "serve.log").read_text()


def test_train_it_two_steps_and_read_its_rows(user: Path):
    (command,) = re.findall(r"```bash\n(.*?)```", PAGE.read_text(), flags=re.DOTALL)
    command = command.strip().replace("bash REPO/", f"bash {REPO}/")
    assert "CONFIG=my_agent_cpu.yaml" in command and "MODEL=tiny" in command and "STEPS=2" in command
    train_as_user(command, user)
    out = user / "runs" / "my_agent"
    # It learns in its run: the learning rate of both steps is the run's, not a warm-up's 0.
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rates = {m["step"]: m["data"]["actor/lr"] for m in metrics if "actor/lr" in m["data"]}
    assert sorted(rates) == [1, 2] and all(rate > 0 for rate in rates.values()), rates

    rows_command = re.search(r"(python -m verl_ext\.rows \S+ --tokenizer MODEL)", PAGE.read_text()).group(1)
    done = run(rows_command.replace("MODEL", "tiny") + " --json", user)
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    by_trajectory: dict[str, list[dict]] = {}
    for row in rows:
        by_trajectory.setdefault(row["trajectory"], []).append(row)
    assert len(by_trajectory) == 4 * 4  # train_batch_size 4 x rollout.n 4 of the last step
    tokenizer = load_tokenizer("tiny")
    questions = pd.read_parquet(user / "data" / "train.parquet")["input"].tolist()
    drafts = {
        tuple(chat_prompt_ids(tokenizer, [{"role": "user", "content": DRAFT.format(question=q)}])): q for q in questions
    }
    for trajectory, calls in by_trajectory.items():
        # One row per model call: the draft, then the check (the answer, scored).
        assert [(c["turn_index"], c["turn_kind"]) for c in calls] == [(0, "call"), (1, "final")], trajectory
        draft, final = calls
        question = drafts[tuple(draft["prompt_ids"])]  # the draft's prompt: the question in the chat template
        # The check's prompt holds the draft as the agent read it: its sampled ids decoded, in the chat template.
        reply = tokenizer.decode(draft["response_ids"], skip_special_tokens=True)
        check = [{"role": "user", "content": CHECK.format(question=question, draft=reply)}]
        assert final["prompt_ids"] == chat_prompt_ids(tokenizer, check), trajectory
        assert all(0 < len(c["response_ids"]) <= 32 for c in calls)
        assert draft["advantage"] == final["advantage"]  # the trajectory's one advantage on every row
