"""One endpoint per model: an existing URL, a ``vllm serve`` the harness starts on GPU machines, or a local
``transformers serve`` on CPU (:mod:`recurrent.local_server`).

The harness owns the servers it starts (:func:`recurrent.local_server.managed_server`): each runs in its own
process group and is stopped (SIGTERM, then SIGKILL) when the model is done, on errors and on Ctrl-C / SIGTERM
alike. Readiness means the process is alive and ``GET /v1/models`` lists the served name (the original polled
the same endpoint every 5 s).

Replicas across a node's GPUs (the original used Ray Serve with ``num_replicas = GPUs // tp``) come from
vLLM's own data parallelism: ``--data-parallel-size GPUs // tp``, one OpenAI endpoint in front.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from recurrent.local_server import ServerError, free_port, managed_server, transformers_serve
from recurrent.local_server import wait_ready as wait_until
from recurrent.models import resolve_model_path

from .config import ModelEntry

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Endpoint:
    base_url: str  # http://host:port/v1
    model: str  # the name requests use
    kind: str  # url | vllm | transformers
    pid: int | None = None  # the server process we started, if any
    process: subprocess.Popen | None = field(default=None, compare=False, repr=False)
    log_path: Path | None = None


def gpu_count() -> int:
    """GPUs visible to this process (0 on CPU machines)."""
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # a broken CUDA install must not stop a CPU evaluation
        return 0


def vllm_available() -> bool:
    return bool(shutil.which("vllm") or Path(sys.executable).with_name("vllm").exists())


def choose_backend(entry: ModelEntry, requested: str = "auto", gpus: int | None = None) -> str:
    """``vllm`` or ``transformers`` for a model with no URL: the flag wins, then the table, then the machine."""
    kind = requested if requested != "auto" else entry.serve
    if kind != "auto":
        return kind
    gpus = gpu_count() if gpus is None else gpus
    return "vllm" if gpus > 0 and vllm_available() else "transformers"


def vllm_cpu_env(gpus: int | None = None) -> dict[str, str]:
    """What vLLM's CPU build needs beside its command line, on a machine with no GPU: its sampler run eagerly
    (``TORCHDYNAMO_DISABLE``: its torch.compile'd sampling kernel crashed engines on CPU; docs/cluster.md, "vLLM on
    CPU"), unless the caller's environment says otherwise. Nothing on a GPU node."""
    if (gpu_count() if gpus is None else gpus) > 0 or "TORCHDYNAMO_DISABLE" in os.environ:
        return {}
    return {"TORCHDYNAMO_DISABLE": "1"}


def vllm_command(
    model_path: str,
    served_name: str,
    port: int,
    tp: int = 1,
    replicas: int = 1,
    max_model_len: int | None = None,
    extra_args: Sequence[str] = (),
    host: str = "127.0.0.1",
    vllm_bin: str | None = None,
) -> list[str]:
    """The ``vllm serve`` command line of one model: ``tp`` GPUs per replica, ``replicas`` data-parallel copies."""
    if tp < 1 or replicas < 1:
        raise ValueError(f"tp and replicas must be >= 1, got {tp}, {replicas}")
    if vllm_bin is None:
        local = Path(sys.executable).with_name("vllm")
        vllm_bin = str(local) if local.exists() else "vllm"
    cmd = [vllm_bin, "serve", model_path, "--served-model-name", served_name, "--host", host, "--port", str(port)]
    cmd += ["--tensor-parallel-size", str(tp)]
    if replicas > 1:
        cmd += ["--data-parallel-size", str(replicas)]
    if max_model_len:
        cmd += ["--max-model-len", str(max_model_len)]
    return cmd + list(extra_args)


def vllm_command_for(
    entry: ModelEntry,
    model_path: str,
    port: int,
    gpus: int,
    replicas: int | None = None,
    vllm_bin: str | None = None,
) -> list[str]:
    """The ``vllm serve`` line the harness starts for a table entry on a node with ``gpus`` GPUs (the GPU-stack
    check parses exactly this with vLLM's own parser: docs/cluster.md)."""
    return vllm_command(
        model_path,
        entry.request_name,
        port,
        tp=entry.tp,
        replicas=replicas_for(entry.tp, gpus, replicas),
        max_model_len=entry.max_model_len,
        extra_args=entry.vllm_args,
        vllm_bin=vllm_bin,
    )


def replicas_for(tp: int, gpus: int, requested: int | None = None) -> int:
    """Data-parallel replicas: as asked, else every GPU of the node used (``gpus // tp``, at least 1)."""
    if requested is not None:
        if requested * tp > max(gpus, tp):
            raise ValueError(f"{requested} replicas x tp {tp} needs {requested * tp} GPUs; {gpus} visible")
        return requested
    return max(1, gpus // tp)


def served_models(base_url: str, timeout: float = 5.0, api_key: str | None = None) -> list[str] | None:
    """The model ids ``GET {base_url}/models`` lists, or None if the server does not answer (yet)."""
    request = urllib.request.Request(base_url.rstrip("/") + "/models")
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            data = json.loads(response.read())
    except (OSError, ValueError):
        return None
    return [m.get("id") for m in data.get("data", []) if isinstance(m, dict)]


ENDPOINT_CHECK_TIMEOUT = 10.0  # seconds for the check of an endpoint given by URL


def endpoint_problem(base_url: str, timeout: float = ENDPOINT_CHECK_TIMEOUT) -> str | None:
    """Why ``base_url`` cannot be reached, or None when ``GET {base_url}/models`` gets an HTTP answer of any
    status (a hosted deployment URL may have no /models: that is for its requests to report). Sends the key of
    env ``API_KEY`` as the client does; a query string (Azure's ``?api-version=``) stays at the end."""
    parts = urlsplit(base_url)
    url = urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/") + "/models", parts.query, ""))
    request = urllib.request.Request(url)
    key = os.environ.get("API_KEY")
    if key:
        request.add_header("Authorization", f"Bearer {key}")
        request.add_header("api-key", key)
    try:
        with urllib.request.urlopen(request, timeout=timeout):
            return None
    except urllib.error.HTTPError:
        return None  # it answered
    except (OSError, ValueError, http.client.HTTPException) as err:  # refused, unknown host, timeout, bad URL
        return f"GET {url} failed: {getattr(err, 'reason', None) or err}"


def models_probe(base_url: str, model: str) -> Callable[[], str | None]:
    """Ready when ``GET {base_url}/models`` lists ``model`` (the readiness check of every server we start)."""

    def probe() -> str | None:
        models = served_models(base_url)
        if models is not None and model in models:
            return None
        listed = f"it lists {models}" if models is not None else "it does not answer"
        return f"{model!r} not served at {base_url} ({listed})"

    return probe


def wait_ready(
    base_url: str,
    model: str,
    process: subprocess.Popen | None = None,
    timeout: float = 1800.0,
    interval: float = 5.0,
    log_path: Path | None = None,
) -> float:
    """Poll until ``model`` is listed by the server; returns the seconds waited
    (:func:`recurrent.local_server.wait_ready` with :func:`models_probe`)."""
    return wait_until(models_probe(base_url, model), process, timeout, interval, log_path)


@contextmanager
def endpoint(
    entry: ModelEntry,
    url: str | None = None,
    backend: str = "auto",
    replicas: int | None = None,
    log_dir: str | Path | None = None,
    ready_timeout: float = 1800.0,
    vllm_bin: str | None = None,
    poll_interval: float = 5.0,
) -> Iterator[Endpoint]:
    """The endpoint of one model for the duration of the block: ``url`` (or the table's) as is; otherwise a
    server started here and stopped at the end. Weights are never downloaded: the checkpoint must be a local
    folder, an offline alias or already in the Hugging Face cache."""
    url = url or entry.url
    if url:
        yield Endpoint(url, entry.request_name, "url")
        return
    kind = choose_backend(entry, backend)
    model_path = resolve_model_path(entry.checkpoint)  # raises ModelNotAvailableError with what to do
    log_dir = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix="memagent-serve-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{kind}-{entry.name.replace('/', '_')}.log"
    if kind == "transformers":
        with contextlib.ExitStack() as stack:
            try:
                server = stack.enter_context(
                    transformers_serve(
                        model_path, startup_timeout=ready_timeout, log_path=log_path, extra_args=entry.transformers_args
                    )
                )
            except (RuntimeError, TimeoutError) as err:  # its start only; errors of the caller's block pass as is
                raise ServerError(f"transformers serve for {entry.name} did not start: {err}") from err
            log.info("transformers serve pid %d at %s", server.process.pid, server.base_url)
            yield Endpoint(server.base_url, server.model, kind, server.process.pid, server.process, log_path)
        return
    if kind != "vllm":
        raise ValueError(f"unknown backend {kind!r}")
    port = free_port()
    cmd = vllm_command_for(entry, model_path, port, gpu_count(), replicas, vllm_bin)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", **vllm_cpu_env()}  # never a download at run time
    base_url = f"http://127.0.0.1:{port}/v1"
    probe = models_probe(base_url, entry.request_name)
    hint = " (GPU machines: make setup-gpu)"
    with managed_server(cmd, probe, log_path, ready_timeout, poll_interval, env, missing_hint=hint) as process:
        log.info("vllm serve pid %d at %s", process.pid, base_url)
        yield Endpoint(base_url, entry.request_name, kind, process.pid, process, log_path)
