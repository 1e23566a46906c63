"""docs/write_your_own_agent.md, run as a reader would, in a folder outside the repository: its agent file written
out, tried against a scripted server, its data written, its config composed on the repository's configs from that
folder and checked by the trainer's preflight (as a call and as the command), its trajectory reward run."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from aiohttp import web
from threaded_http import serve_in_a_thread

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "write_your_own_agent.md"


def blocks(language: str) -> list[str]:
    """The tutorial's blocks, from section 1 on ("Bring the agent you have" is tests/test_bring_your_agent.py's)."""
    tutorial = PAGE.read_text().split("\n## 1. ", 1)[1]
    return re.findall(rf"```{language}\n(.*?)```", tutorial, flags=re.DOTALL)


def forgetful_app(seen: list[list[dict]]) -> web.Application:
    """A model that forgets the box the first time it is asked, then boxes its answer."""

    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append(body["messages"])
        text = "Six times seven is 42." if len(seen) == 1 else "So the answer is \\boxed{42}."
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
        usage = {"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10}
        return web.json_response(
            {"id": "x", "object": "chat.completion", "model": "m", "choices": [choice], "usage": usage}
        )

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    return app


@pytest.fixture
def in_tmp(tmp_path: Path):
    previous = os.getcwd()
    os.chdir(tmp_path)
    try:
        yield tmp_path
    finally:
        os.chdir(previous)


def test_the_pages_code_runs_in_order(in_tmp: Path, tiny_model_dir):
    python, yaml_blocks = blocks("python"), blocks("yaml")
    assert len(python) == 5 and len(yaml_blocks) == 1
    agent_file, try_it, write_data, check_it, reward = python
    # 1. The agent file, as the page names it.
    assert agent_file.startswith("# my_agent.py\n")
    (in_tmp / "my_agent.py").write_text(agent_file)

    # 2. Tried against a server: the first reply has no box, so the agent asks again with the conversation so far.
    seen: list[list[dict]] = []
    with serve_in_a_thread(forgetful_app(seen), wait_s=30) as url:
        printed = io.StringIO()
        namespace = {"URL": url, "MODEL": "m"}
        with contextlib.redirect_stdout(printed):
            exec(compile(try_it, "write_your_own_agent.md:try", "exec"), namespace)
    episode = namespace["episode"]
    assert [len(messages) for messages in seen] == [1, 3]
    assert seen[1][1] == {"role": "assistant", "content": "Six times seven is 42."}
    assert seen[1][2]["content"] == "Put your final answer in \\boxed{}."
    assert episode.answer == "So the answer is \\boxed{42}." and len(episode.history) == 2
    assert printed.getvalue().splitlines()[-1] == "answer: So the answer is \\boxed{42}."

    # 2. Its data: the training parquet (prompt a chat list) and the harness's eval file (no context).
    exec(compile(write_data, "write_your_own_agent.md:data", "exec"), {})
    train = pd.read_parquet(in_tmp / "data" / "train.parquet")
    assert list(train["prompt"][0]) == [{"role": "user", "content": "What is 6 times 7?"}]
    assert (
        train["reward_model"][0] == {"ground_truth": "42"}
        and len(pd.read_parquet(in_tmp / "data" / "validation.parquet")) == 2
    )
    items = [json.loads(line) for line in (in_tmp / "evaldata" / "eval_arith_1.jsonl").read_text().splitlines()]
    assert items[0] == {"index": 0, "input": "What is 6 times 7?", "answers": ["42"]} and len(items) == 4

    # 3-4. The config beside the agent, composed on the repository's configs from this folder, and checked by the
    # trainer's preflight (its trial episode included), as a Python call and as the page's command.
    assert yaml_blocks[0].startswith("# my_agent_cpu.yaml\n")
    (in_tmp / "my_agent_cpu.yaml").write_text(yaml_blocks[0])
    namespace = {}
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(check_it, "write_your_own_agent.md:check", "exec"), namespace)
    assert printed.getvalue().strip() == "ready: my_agent.py"
    command = re.search(r"`(python -m verl_ext\.preflight [^`]*)`", PAGE.read_text().replace("\n", " ")).group(1)
    done = subprocess.run(
        [sys.executable, *command.split()[1:]], cwd=in_tmp, capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0 and "[memagent] ready:" in done.stdout, done.stderr[-3000:]

    # The preflight does check: data without the agent's column is refused, naming it.
    from verl_ext.preflight import PreflightError, preflight

    pd.DataFrame(
        [{"prompt": [{"role": "user", "content": "q"}], "data_source": "toy", "reward_model": {"ground_truth": "1"}}]
    ).to_parquet(in_tmp / "bad.parquet")
    config = namespace["config"]
    config.data.train_files = str(in_tmp / "bad.parquet")
    with pytest.raises(PreflightError, match="has no column 'input'"):
        preflight(config)

    # The reward over the whole trajectory: two tool results, one an error.
    namespace = {}
    exec(compile(reward, "write_your_own_agent.md:reward", "exec"), namespace)
    conversation = [
        {"role": "user", "content": "q"},
        {"role": "tool", "content": "42"},
        {"role": "tool", "content": "error: division by zero"},
    ]
    trajectory = [{"messages": conversation[:1], "reply": "a"}, {"messages": conversation, "reply": "b"}]
    assert namespace["tools_that_worked"]("s", "b", "42", {"trajectory": trajectory}) == 0.5


def test_the_example_configs_warm_up_fits_its_run(tmp_path: Path):
    """verl's warm-up starts the learning rate at 0 (get_constant_schedule_with_warmup): the page's run of a few
    steps must not spend them warming up (recurrent_trainer's 20 steps would)."""
    from hydra import compose, initialize_config_dir

    configs = tmp_path / "configs"
    shutil.copytree(REPO / "configs", configs)
    (configs / "my_agent_cpu.yaml").write_text(blocks("yaml")[0])
    with initialize_config_dir(config_dir=str(configs), version_base=None):
        optim = compose("my_agent_cpu").actor_rollout_ref.actor.optim
    steps = int(re.search(r"STEPS=(\d+)", blocks("bash")[0]).group(1))
    warmup = optim.lr_warmup_steps if (optim.lr_warmup_steps or 0) > 0 else int(optim.lr_warmup_steps_ratio * steps)
    assert warmup == 0 < steps


def test_the_training_command_is_the_launchers():
    """The page's training block runs the launcher with a run config (CONFIG=), as the calculator's trainer does."""
    (command,) = blocks("bash")
    assert "CONFIG=my_agent_cpu.yaml" in command and "scripts/train_tiny_cpu.sh" in command
    assert "CONFIG=" in (REPO / "scripts" / "train_tiny_cpu.sh").read_text()


def dry_run(folder: Path, command: str, *overrides: str) -> str:
    """The page's training command run as given (its variables, the launcher from this checkout) with DRY_RUN=1 and
    ``overrides`` after it: the composed config the launcher prints."""
    *assignments, launcher, script = command.split()
    assert launcher == "bash" and script == "REPO/scripts/train_tiny_cpu.sh"
    env = {**os.environ, **dict(a.split("=", 1) for a in assignments), "DRY_RUN": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        ["bash", str(REPO / "scripts" / "train_tiny_cpu.sh"), *overrides],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_training_is_async_unless_a_trailing_override_says_sync(tmp_path: Path, tiny_model_dir):
    """Section 5: the page's run trains in async mode (the generic trainer's default) and the launcher takes trailing
    Hydra overrides (recurrent.mode=sync), as the page says; checked on the config the launcher composes."""
    (command,) = blocks("bash")
    (tmp_path / "my_agent.py").write_text(blocks("python")[0])
    (tmp_path / "my_agent_cpu.yaml").write_text(blocks("yaml")[0])
    (tmp_path / "data").mkdir()
    row = {"prompt": [{"role": "user", "content": "What is 6 times 7?"}], "reward_model": {"ground_truth": "42"}}
    for split in ("train", "validation"):
        pd.DataFrame([row | {"data_source": "arith"}]).to_parquet(tmp_path / "data" / f"{split}.parquet")
    mode = re.compile(r"^recurrent:\n(?:  .*\n)*?  mode: (\w+)$", re.MULTILINE)
    assert mode.search(dry_run(tmp_path, command)).group(1) == "async"
    assert mode.search(dry_run(tmp_path, command, "recurrent.mode=sync")).group(1) == "sync"
    text = " ".join(PAGE.read_text().split())
    assert "It trains in **async mode**, the generic trainer's default (`recurrent.mode: async`" in text
    assert "The same command ending in `train_tiny_cpu.sh recurrent.mode=sync` trains in sync mode" in text


def test_the_quoted_log_prob_agreement_is_the_calculators_run():
    """Section 5's `training/rollout_probs_diff_max` of the calculator's committed run: its range over the run's
    steps, from docs/calculator_cpu/metrics.jsonl."""
    lines = (REPO / "docs" / "calculator_cpu" / "metrics.jsonl").read_text().splitlines()
    diffs = [
        d["training/rollout_probs_diff_max"]
        for d in (json.loads(x)["data"] for x in lines)
        if "training/rollout_probs_diff_max" in d
    ]
    assert len(diffs) >= 10
    quoted = f"{min(diffs) * 1e6:.1f}-{max(diffs) * 1e6:.1f}e-6 in the calculator's committed run"
    for page in (PAGE, REPO / "docs" / "fidelity.md"):  # docs/fidelity.md, "Sampling of its own", quotes it too
        assert quoted in " ".join(page.read_text().split()), page.name
