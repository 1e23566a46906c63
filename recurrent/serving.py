"""Start and stop a local OpenAI-compatible server (``transformers serve``) for a model folder.

Used by the quickstart, the evaluation harness and the tests on CPU. On GPU machines users run
``vllm serve MODEL`` themselves (or the harness does); everything downstream only sees a base URL.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class LocalServer:
    base_url: str  # e.g. http://127.0.0.1:PORT/v1
    model: str  # the name requests must use
    process: subprocess.Popen
    log_path: Path


PR_SET_PDEATHSIG = 1  # prctl(2) option: the signal a process gets when its parent dies


def _die_with_parent():
    """A ``preexec_fn`` that makes the child get SIGTERM when this process dies, however it dies (SIGKILL
    included, where no clean-up of ours runs). Linux only; None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before the fork: the child only calls it
    parent = os.getpid()

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the parent died before the call above took effect
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


def spawn_server(cmd: list[str], log_path: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start a server process that cannot outlive us: its own process group (stopped as a whole), stdout and
    stderr to ``log_path``, no stdin, and SIGTERM when this process dies."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("w") as log:
        return subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
            preexec_fn=_die_with_parent(),
        )


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def sampling_overlay(model_dir: Path, folder: Path) -> Path:
    """A view of ``model_dir`` in ``folder`` (symlinks) whose generation config switches sampling on.

    ``transformers serve`` sets ``temperature`` and ``top_p`` from a request but samples only when the model's
    generation config says ``do_sample``; most checkpoints (and our offline models) do not, so every request
    would decode greedily whatever it asked for. With ``do_sample`` on, a request at temperature 0 is still
    greedy (the server switches sampling off for it), as on vLLM."""
    folder.mkdir(parents=True, exist_ok=True)
    for entry in model_dir.iterdir():
        if entry.name != "generation_config.json":
            (folder / entry.name).symlink_to(entry)
    config_path = model_dir / "generation_config.json"
    config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    (folder / "generation_config.json").write_text(json.dumps({**config, "do_sample": True}, indent=2))
    return folder


@contextmanager
def transformers_serve(
    model_dir: str | Path,
    port: int | None = None,
    startup_timeout: float = 180.0,
    log_path: str | Path | None = None,
    sample: bool = True,
) -> Iterator[LocalServer]:
    """Run ``transformers serve`` on 127.0.0.1 with ``model_dir`` preloaded; stop it on exit.

    The server runs offline (no hub access). Its log goes to ``log_path`` (a temp file by default) and
    is quoted in the error if the server dies or does not become ready in time. With ``sample`` (the default)
    it serves a :func:`sampling_overlay` of the model, so that requests sample at the temperature they ask for;
    the name requests use is then the overlay's folder (``LocalServer.model``).
    """
    model_dir = str(Path(model_dir).resolve())
    port = port or free_port()
    log_path = Path(log_path) if log_path else Path(tempfile.mkstemp(prefix="transformers-serve-", suffix=".log")[1])
    overlay = None
    if sample:  # next to the log: the run's folder, where a run killed outright leaves it for a look
        log_path.parent.mkdir(parents=True, exist_ok=True)
        overlay = Path(tempfile.mkdtemp(prefix="model-view-", dir=log_path.parent))
        model_dir = str(sampling_overlay(Path(model_dir), overlay / Path(model_dir).name))
    hub_cache = Path(tempfile.gettempdir()) / "memagent-hf-hub"
    hub_cache.mkdir(exist_ok=True)  # /v1/models scans the hub cache and fails if the folder is missing
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_CACHE": str(hub_cache)}
    cli = Path(sys.executable).with_name("transformers")
    cmd = [str(cli), "serve", "--host", "127.0.0.1", "--port", str(port), "--device", "cpu", model_dir]
    process = None
    try:
        process = spawn_server(cmd, log_path, env)
        deadline = time.monotonic() + startup_timeout
        while not _healthy(f"http://127.0.0.1:{port}/health"):
            if process.poll() is not None:
                raise RuntimeError(
                    f"transformers serve exited with {process.returncode}:\n{log_path.read_text()[-3000:]}"
                )
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"transformers serve not ready after {startup_timeout:.0f} s:\n{log_path.read_text()[-3000:]}"
                )
            time.sleep(0.5)
        yield LocalServer(f"http://127.0.0.1:{port}/v1", model_dir, process, log_path)
    finally:
        if process is not None and process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        if overlay is not None:
            shutil.rmtree(overlay, ignore_errors=True)
