"""Start and stop local OpenAI-compatible servers: the lifecycle every server we start goes through
(:func:`managed_server`: spawn, wait until it answers, stop its process group), and ``transformers serve`` for a
model folder on top of it.

Used by the quickstart, the evaluation harness (which also starts ``vllm serve`` with :func:`managed_server`)
and the tests on CPU. Everything downstream only sees a base URL.

``python -m recurrent.local_server --model tiny`` serves a local model on CPU until Ctrl-C, to try an agent against
(docs/write_your_own_agent.md, "2. Try it against a server"): ``transformers serve`` with the fixes a hand-started
one lacks (requests sample at the temperature they ask for, ``/v1/models`` answers, no hub access), behind a front
that gives ``n`` and the sampling rule of every entry point (recurrent/local_front.py). It prints the
``URL`` and the ``MODEL`` name requests use, one ``NAME=value`` line each. Its options are checked before the
server starts, each refused in one line with exit status 2: a model that is not there or a folder without a model's
files (config.json, weights, a tokenizer), a port another process listens on, a log it cannot write (a missing
folder of ``--log`` is made). A server that exits on its own, while starting or serving, ends it with one line
quoting the end of the server's log and exit status 1.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from recurrent.flags import add_flags, flag, from_args
from recurrent.options import port as port_number
from recurrent.options import positive_seconds
from recurrent.sampling import argument as sampling_argument
from recurrent.sampling import describe_rule

log = logging.getLogger(__name__)


class ServerError(RuntimeError):
    """A server we started did not come up (it exited, or was not ready in time)."""


class ServerTimeoutError(ServerError, TimeoutError):
    """A server we started was not ready in time."""


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


def log_tail(log_path: Path | None, chars: int = 3000) -> str:
    """The end of a server log, quoted in errors ("" when there is none)."""
    if log_path is None or not log_path.exists():
        return ""
    return log_path.read_text(errors="replace")[-chars:]


Probe = Callable[[], "str | None"]  # None once the server is ready, else why it is not (quoted on a timeout)


def wait_ready(
    probe: Probe,
    process: subprocess.Popen | None,
    timeout: float,
    interval: float,
    log_path: Path | None = None,
    name: str = "server",
) -> float:
    """Poll ``probe`` until it says ready; returns the seconds waited. Raises :class:`ServerError` when the
    process exits first and :class:`ServerTimeoutError` after ``timeout``, both quoting the end of the log."""
    start = time.monotonic()
    while True:
        why_not = probe()
        if why_not is None:
            return time.monotonic() - start
        if process is not None and process.poll() is not None:
            raise ServerError(
                f"{name} exited with code {process.returncode} before it was ready:\n{log_tail(log_path)}"
            )
        if time.monotonic() - start > timeout:
            raise ServerTimeoutError(f"{name} not ready after {timeout:.0f} s: {why_not}:\n{log_tail(log_path)}")
        time.sleep(interval)


def stop_process_group(process: subprocess.Popen, grace: float = 30.0) -> None:
    """SIGTERM the process's group, SIGKILL it after ``grace`` seconds (servers spawn workers: stop them all)."""
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    except ProcessLookupError:
        process.wait()


@contextmanager
def managed_server(
    cmd: list[str],
    probe: Probe,
    log_path: Path,
    ready_timeout: float,
    interval: float,
    env: dict[str, str] | None = None,
    grace: float = 30.0,
    missing_hint: str = "",
) -> Iterator[subprocess.Popen]:
    """Start ``cmd`` (:func:`spawn_server`), wait until ``probe`` says ready, stop its group on exit, errors of
    the caller's block and Ctrl-C included."""
    name = Path(cmd[0]).name + (f" {cmd[1]}" if len(cmd) > 1 else "")
    try:
        process = spawn_server(cmd, log_path, env)
    except OSError as err:  # e.g. no `vllm` on this machine
        raise ServerError(f"cannot start {cmd[0]}: {err}{missing_hint}") from err
    try:
        log.info("started %s (pid %d), log %s", name, process.pid, log_path)
        waited = wait_ready(probe, process, ready_timeout, interval, log_path, name)
        log.info("%s ready after %.1f s", name, waited)
        yield process
    finally:
        stop_process_group(process, grace)


def health_probe(url: str) -> Probe:
    """Ready when ``GET url`` answers 200."""

    def probe() -> str | None:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return None
                return f"GET {url} answers {response.status}"
        except OSError:
            return f"GET {url} does not answer"

    return probe


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


# What a model served on CPU computes in. `transformers serve --dtype auto` takes the config's dtype, and verl's
# checkpoint export writes "bfloat16" there over fp32 weights: the policy would be evaluated in numbers it was not
# trained or sampled in (the CPU twin does both in fp32: configs/cpu_platform.yaml), and bf16 is emulated on CPUs
# without bf16 instructions (the replication's reader: a forward 1.8x slower). docs/replication_cpu_notebook.md, "The
# evaluation's servers".
CPU_DTYPE = "float32"


@contextmanager
def transformers_serve(
    model_dir: str | Path,
    port: int | None = None,
    startup_timeout: float = 180.0,
    log_path: str | Path | None = None,
    sample: bool = True,
    extra_args: Sequence[str] = (),
    dtype: str = CPU_DTYPE,
    view_dir: Path | None = None,
) -> Iterator[LocalServer]:
    """Run ``transformers serve`` on 127.0.0.1 with ``model_dir`` preloaded; stop it on exit.

    The server runs offline (no hub access). Its log goes to ``log_path`` (a temp file by default) and is
    quoted in the :class:`ServerError` if the server dies or does not become ready in time. With ``sample`` (the
    default) it serves a :func:`sampling_overlay` of the model, so that requests sample at the temperature they ask for;
    the name requests use is then the overlay's folder (``LocalServer.model``). ``extra_args`` go to the command
    line as they are (e.g. ``--continuous-batching`` and its ``--cb-*`` settings). The model computes in ``dtype``
    (``--dtype``; fp32 by default, :data:`CPU_DTYPE`), unless ``extra_args`` name one. ``view_dir``: where the
    sampling view is made and kept, so that the same folder gives the same model name at every start
    (:func:`stable_view_dir`); by default a fresh folder next to the log, removed on exit.
    """
    model_dir = str(Path(model_dir).resolve())
    port = port or free_port()
    log_path = Path(log_path) if log_path else Path(tempfile.mkstemp(prefix="transformers-serve-", suffix=".log")[1])
    overlay = None
    if sample and view_dir is not None:  # made afresh in a folder of its own, its path (the name) kept
        view_dir.parent.mkdir(parents=True, exist_ok=True)
        fresh = Path(tempfile.mkdtemp(prefix=f"{view_dir.name}.", dir=view_dir.parent))
        sampling_overlay(Path(model_dir), fresh / Path(model_dir).name)
        shutil.rmtree(view_dir, ignore_errors=True)
        fresh.rename(view_dir)
        model_dir = str(view_dir / Path(model_dir).name)
    elif sample:  # next to the log: the run's folder, where a run killed outright leaves it for a look
        log_path.parent.mkdir(parents=True, exist_ok=True)
        overlay = Path(tempfile.mkdtemp(prefix="model-view-", dir=log_path.parent))
        model_dir = str(sampling_overlay(Path(model_dir), overlay / Path(model_dir).name))
    hub_cache = Path(tempfile.gettempdir()) / "memagent-hf-hub"
    hub_cache.mkdir(exist_ok=True)  # /v1/models scans the hub cache and fails if the folder is missing
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_CACHE": str(hub_cache)}
    cli = Path(sys.executable).with_name("transformers")
    dtype_args = [] if "--dtype" in extra_args else ["--dtype", dtype]
    cmd = [str(cli), "serve", "--host", "127.0.0.1", "--port", str(port), "--device", "cpu", *dtype_args, *extra_args]
    cmd.append(model_dir)
    try:
        with managed_server(
            cmd, health_probe(f"http://127.0.0.1:{port}/health"), log_path, startup_timeout, 0.5, env, grace=20
        ) as process:
            yield LocalServer(f"http://127.0.0.1:{port}/v1", model_dir, process, log_path)
    finally:
        if overlay is not None:
            shutil.rmtree(overlay, ignore_errors=True)


def stable_view_dir(model_dir: str | Path) -> Path:
    """The folder ``python -m recurrent.local_server`` keeps a model's sampling view in: one per model folder, so
    the model name requests use (the view's path) is the same at every start, and scripts and the endpoint's
    ``--model`` keep working across restarts."""
    resolved = str(Path(model_dir).resolve())
    digest = hashlib.sha256(resolved.encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / "memagent-model-views" / f"{Path(resolved).name}-{digest}"


@dataclass(frozen=True)
class ServeOptions:
    """``python -m recurrent.local_server``: which model, where."""

    model: str = flag(
        "tiny",
        "a model folder, or an offline model's name (tiny, smollm2-135m-instruct; made in the "
        "model cache when missing: python -m recurrent.models) (default %(default)s)",
    )
    port: int = flag(8000, "port on 127.0.0.1 (default %(default)s)", type=port_number)
    log: Path | None = flag(
        None, "the server's log, its folder made when missing (default: a temporary file)", type=Path
    )
    greedy: bool = flag(False, "decode greedily whatever a request asks (the model's own generation config)")
    temperature: float = flag(
        0.7,
        "the temperature of a request that sets neither temperature nor top_p (paper's evaluation: %(default)s)",
        type=sampling_argument("temperature"),
    )
    top_p: float = flag(
        0.95,
        "the top_p of a request that sets neither temperature nor top_p (paper's evaluation: %(default)s)",
        type=sampling_argument("top_p"),
    )
    startup_timeout: float = flag(180.0, "seconds to wait for the server (default %(default)s)", type=positive_seconds)


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """Whether another process listens on ``host:port`` (a bind with SO_REUSEADDR, as the server's own, fails)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def _refuse(message: str, status: int = 2) -> None:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(status)


def _serve_inputs(options: ServeOptions) -> tuple[str, Path]:
    """The model folder and the log path of ``options``, each checked before the server starts (a load takes
    seconds and ends in a traceback): the model resolves to a folder that holds one, the port is free (else the
    other server's /health would pass for ours, and its URL be printed), the log's folder exists (made when
    missing) and the log can be written. Refuses with one line naming the option and exit status 2."""
    from recurrent.models import (
        KNOWN_MODELS,
        ModelNotAvailableError,
        materialize,
        model_folder_problem,
        resolve_model_path,
    )

    try:
        model_dir = (
            str(materialize(options.model)) if options.model in KNOWN_MODELS else resolve_model_path(options.model)
        )
    except (ModelNotAvailableError, ValueError) as err:
        _refuse(f"--model: {err}")
    problem = model_folder_problem(model_dir)
    if problem:
        _refuse(f"--model {options.model}: {model_dir} holds no model: {problem}")
    if port_in_use(options.port):
        _refuse(f"--port {options.port}: 127.0.0.1:{options.port} is in use by another process; choose another port")
    if options.log is None:  # a file of its own, named in the messages below
        handle, name = tempfile.mkstemp(prefix="transformers-serve-", suffix=".log")
        os.close(handle)
        return model_dir, Path(name)
    log_path = options.log.resolve()
    if log_path.is_dir():
        _refuse(f"--log {options.log}: a folder, not a file")
    above = next(folder for folder in log_path.parents if folder.exists())  # "/" exists
    if not above.is_dir():
        _refuse(f"--log {options.log}: {above} is a file, not a folder")
    try:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("a"):
            pass
    except OSError as err:
        _refuse(f"--log {options.log}: cannot write it ({err.strerror or err})")
    return model_dir, log_path


@contextmanager
def serving_front(server: LocalServer, options: ServeOptions) -> Iterator[str]:
    """The front (recurrent/local_front.py) over ``server`` on ``options.port``, in a thread, until the block ends;
    yields its base URL once it listens."""
    import threading

    import uvicorn

    from recurrent.local_front import front_app

    run_sampling = {"temperature": options.temperature, "top_p": options.top_p}
    app = front_app(server.base_url.removesuffix("/v1"), run_sampling)
    front = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=options.port, log_level="warning"))
    thread = threading.Thread(target=front.run, name="local-server-front", daemon=True)
    thread.start()
    while not front.started:  # it binds within a moment; a bind that fails ends the thread
        if not thread.is_alive():
            raise ServerError(f"the front could not listen on 127.0.0.1:{options.port}")
        thread.join(0.05)
    try:
        yield f"http://127.0.0.1:{options.port}/v1"
    finally:
        front.should_exit = True
        thread.join(10)


def main(argv: list[str] | None = None) -> None:
    """Serve a local model until Ctrl-C (or SIGTERM); print ``URL=...`` and ``MODEL=...`` once it answers. Exit
    status 0 when stopped so; 2 for a bad option (one line, before the server starts); 1 when the server exits on
    its own or does not come up (one line, naming its log)."""
    parser = argparse.ArgumentParser(
        prog="python -m recurrent.local_server",
        description="Serve a local model on CPU behind an OpenAI-compatible API (transformers serve: real sampling, "
        "/v1/models) until Ctrl-C; prints URL=... and MODEL=... (the name requests use) once it answers.",
    )
    add_flags(parser, ServeOptions)
    options = from_args(ServeOptions, parser.parse_args(argv))
    model_dir, log_path = _serve_inputs(options)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # the server is stopped on the way out, as for Ctrl-C
    view = stable_view_dir(model_dir)  # the same MODEL name at every start
    # transformers serve on a port of its own, behind the front on --port (n, the sampling rule: local_front.py)
    serving = transformers_serve(model_dir, None, options.startup_timeout, log_path, not options.greedy, view_dir=view)
    server = None
    try:
        with serving as server, serving_front(server, options) as url:
            print(f"URL={url}\nMODEL={server.model}", flush=True)
            print(f"[local_server] serving {model_dir} (log {server.log_path}); Ctrl-C stops it", file=sys.stderr)
            run_sampling = {"temperature": options.temperature, "top_p": options.top_p}
            print(f"[local_server] {describe_rule(run_sampling, 'this server')}", file=sys.stderr)
            code = server.process.wait()  # SIGTERM leaves here through sys.exit(0), Ctrl-C as KeyboardInterrupt
    except KeyboardInterrupt:  # while it starts or serves: the server was stopped on the way out
        sys.exit(0 if server is not None else 130)
    except ServerError as err:  # it exited, or was not ready in time: the end of its log says why
        first, *tail = [line for line in str(err).splitlines() if line.strip()]
        last = f"; its log ({log_path}) ends: {tail[-1].strip()}" if tail else f"; its log: {log_path}"
        _refuse(first.rstrip(":") + last, status=1)
    _refuse(f"the server exited on its own with code {code}; its log: {log_path}", status=1)


if __name__ == "__main__":
    main()
