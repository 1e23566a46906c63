"""Models side by side (``--parallel-models``): they really run at the same time, write what one after another
writes, stop together on SIGTERM and resume, and a model that cannot be served is skipped while the other runs.

The servers are scripted (in a thread of the test): a request of one model is answered only once every model has
sent one, so a run that is not side by side cannot finish (its first request waits for a model that has not
started, then fails). Every wait is on an event, never a sleep."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import threading
from pathlib import Path

import yaml
from eval_fixtures import harness_argv, hotpotqa_set, read_lines
from test_eval_bad_inputs import ScriptedServer

from taskutils.memory_eval.run import main as run_main

MODELS = ("a", "b")
IDS = [10, 11, 12, 13]  # the ids hotpotqa_set gives 4 items
MEET_S = 30.0  # how long a model's first request waits for the others' (only a broken run waits that long)


class MeetingServer(ScriptedServer):
    """Answers like the instant server, but holds every chat request until each of ``models`` (the request's
    ``model``) has sent one; with ``hold``, it then never answers (a run stopped mid-item)."""

    def __init__(self, models: tuple[str, ...] = MODELS, hold: bool = False) -> None:
        super().__init__(drop=lambda n: False)
        self.models, self.hold = set(models), hold
        self.seen: set[str] = set()
        self.met = threading.Event()  # for the test's thread
        self._met: asyncio.Event | None = None  # for the server's loop

    async def _respond(self, path: str, method: str, body: bytes) -> tuple[int, dict]:
        if method == "POST" and path.endswith("/chat/completions"):
            if self._met is None:
                self._met = asyncio.Event()
            self.seen.add(json.loads(body)["model"])
            if self.seen >= self.models:
                self._met.set()
                self.met.set()
            await asyncio.wait_for(self._met.wait(), MEET_S)
            if self.hold:
                await asyncio.Event().wait()  # never answered
        return await super()._respond(path, method, body)


def write_table(path: Path, url: str, names: tuple[str, ...] = MODELS, missing: str | None = None) -> Path:
    models = [{"name": name, "checkpoint": "tiny", "url": url, "served_name": name, "concurrency": 1} for name in names]
    if missing:  # a checkpoint that is nowhere: the model cannot be served
        models.append({"name": missing, "checkpoint": "no-such-org/no-such-model-xyz", "concurrency": 1})
    path.write_text(yaml.safe_dump({"models": models}))
    return path


def setup(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    data.mkdir()
    hotpotqa_set(data, 2, items=4)
    return data


def results(folder: Path) -> dict[str, list[dict]]:
    """Every results file of ``folder``, its lines without the measured seconds, in id order."""
    out = {}
    for path in sorted(folder.glob("*/*.jsonl")):
        lines = [{k: v for k, v in r.items() if k != "seconds"} for r in read_lines(path)]
        out[f"{path.parent.name}/{path.name}"] = sorted(lines, key=lambda r: r["id"])
    return out


def test_models_side_by_side_run_at_once_and_write_what_one_after_another_writes(tmp_path, tiny_model_dir):
    data = setup(tmp_path)
    options = ("--method", "direct", "--max-retries", "0")
    with ScriptedServer(drop=lambda n: False).running() as url:
        table = write_table(tmp_path / "one.yaml", url)
        argv = harness_argv(data, tmp_path / "one", 2, "--table", str(table), *options)
        assert run_main(argv) == 0
    server = MeetingServer()
    with server.running() as url:
        table = write_table(tmp_path / "two.yaml", url)
        argv = harness_argv(data, tmp_path / "two", 2, "--table", str(table), "--parallel-models", "2", *options)
        assert run_main(argv) == 0
    assert server.met.is_set() and server.answered == 8  # both models had a request in flight at once
    one, two = results(tmp_path / "one"), results(tmp_path / "two")
    assert list(two) == ["hotpotqa_2/a__direct.jsonl", "hotpotqa_2/b__direct.jsonl"]
    assert two == one and all(len(lines) == 4 and all(r["error"] is None for r in lines) for lines in two.values())


def test_sigterm_stops_models_side_by_side_and_the_run_resumes(tmp_path, tiny_model_dir):
    data = setup(tmp_path)
    out = tmp_path / "results"
    server = MeetingServer(hold=True)
    log = tmp_path / "harness.log"
    with server.running() as url:
        table = write_table(tmp_path / "table.yaml", url)
        argv = harness_argv(data, out, 2, "--table", str(table), "--method", "direct", "--parallel-models", "2")
        with log.open("w") as stderr:
            process = subprocess.Popen([sys.executable, "-m", "taskutils.memory_eval.run", *argv], stderr=stderr)
        try:
            assert server.met.wait(120), "the two models never had a request in flight at once"
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=60) == 143  # 128 + SIGTERM (Ctrl-C: 130)
        finally:
            if process.poll() is None:
                process.kill()
    assert "run the same command again to resume" in log.read_text()
    assert all(not read_lines(p) for p in out.glob("*/*.jsonl"))  # the items in flight left no line
    with ScriptedServer(drop=lambda n: False).running() as url:
        table = write_table(tmp_path / "table.yaml", url)  # same models and settings, a new port
        assert run_main(argv) == 0
    assert {name: [r["id"] for r in lines] for name, lines in results(out).items()} == {
        "hotpotqa_2/a__direct.jsonl": IDS,
        "hotpotqa_2/b__direct.jsonl": IDS,
    }


def test_a_model_that_cannot_be_served_is_skipped_while_the_other_runs(tmp_path, capsys, caplog, tiny_model_dir):
    data = setup(tmp_path)
    with ScriptedServer(drop=lambda n: False).running() as url:
        table = write_table(tmp_path / "table.yaml", url, names=("a",), missing="gone")
        argv = harness_argv(data, tmp_path / "out", 2, "--table", str(table), "--method", "direct")
        assert run_main([*argv, "--parallel-models", "2"]) == 1
    assert "gone: skipped: " in caplog.text
    assert "error: model(s) not evaluated: gone" in capsys.readouterr().err
    assert [r["id"] for r in results(tmp_path / "out")["hotpotqa_2/a__direct.jsonl"]] == IDS
