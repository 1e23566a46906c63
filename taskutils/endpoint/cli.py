"""``python -m taskutils.endpoint``: the command line of the MemAgent server, serving any registered agent
(docs/serving.md)."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import uvicorn

from recurrent.options import (
    ConfigError,
    agent_config,
    non_negative_int,
    parse_with_config,
    port,
    positive_int,
    positive_seconds,
    seconds,
)
from recurrent.sampling import argument as sampling_argument

if TYPE_CHECKING:
    from taskutils.endpoint.service import ServeSettings

DESCRIPTION = """\
Serve a memory agent behind an OpenAI-compatible API. Any OpenAI client (a chat UI, an application, another lab's
evaluation harness) sends one long request; the server reads the document chunk by chunk with the MemAgent memory
loop, each turn a request to the upstream OpenAI-compatible server, and answers as one chat completion.

  python -m taskutils.endpoint --upstream http://localhost:8001/v1 --model BytedTsinghua-SIA/RL-MemoryAgent-14B
  python -m taskutils.endpoint --model smollm2-135m-instruct --chunk-size 500 --max-new 64   # CPU: starts its own
  # then: OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="unused").chat.completions.create(...)

Without --upstream, --model is a model available offline (a folder, tiny, smollm2-135m-instruct, a cached hub id):
a local `transformers serve` is started for it and stopped with the server. Budgets default to the paper's
evaluation protocol (the harness's memory method): --chunk-size 5000 --max-new 1024 --final-max-new 1024, the whole
document, --final-prompt answer_is; at temperature 0 an answer equals the harness's for the same item and budgets.
Where the question is: --question-mode (auto, field, messages, split), also per request in the memagent field.
Every option can come from --config FILE (YAML, keys as the long flags); flags on the command line win.
Another agent: --agent NAME (a registered name) or --agent path/to/agent.py, its settings from
--agent-config FILE (YAML or JSON, the fields of its config class); a tokenizer is loaded only for an agent that
counts tokens.
"""


def build_parser() -> argparse.ArgumentParser:
    from recurrent.impls.memory import FINAL_TEMPLATES
    from taskutils.endpoint.questions import QUESTION_MODES
    from taskutils.endpoint.spool import MAX_REQUEST_BYTES, SPOOL_BYTES

    parser = argparse.ArgumentParser(
        prog="python -m taskutils.endpoint",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", type=Path, help="YAML file of defaults for these options (keys as the long flags)")
    up = parser.add_argument_group("model and upstream")
    up.add_argument(
        "--model",
        help="with --upstream: the model name the upstream serves; without: a model available offline, served "
        "locally by transformers serve (required)",
    )
    up.add_argument("--upstream", help="base URL of an OpenAI-compatible server (vLLM, a hosted API), e.g. .../v1")
    up.add_argument(
        "--api-key-env",
        metavar="VAR",
        help="environment variable holding the upstream's API key (default: API_KEY if set); never logged",
    )
    up.add_argument(
        "--tokenizer",
        help="tokenizer folder or cached hub id, for an agent that counts tokens (the memory agent's chunks, the "
        "direct agent's truncation; default: the model's; required then for an upstream model that is not "
        "available offline); an agent that needs none loads none",
    )
    up.add_argument("--served-model-name", help="the model name clients use (default: --model)")
    up.add_argument("--server-log", type=Path, help="without --upstream: the local server's log (default: a temp file)")
    up.add_argument("--ready-timeout", type=seconds, default=300.0, help="seconds for the local server to start")
    up.add_argument(
        "--agent",
        default="memory",
        help="the agent to serve: a registered name (memory, direct, calculator, ...), a module path, or a file path "
        "(path/to/agent.py, relative to the working directory); default memory: each request's document is read "
        "by the memory agent",
    )
    up.add_argument(
        "--agent-config",
        type=Path,
        metavar="FILE",
        help="YAML or JSON file of the agent's config fields (its config class; relative to the working "
        "directory), set over its defaults; for the memory agent, over the budgets below",
    )
    agent = parser.add_argument_group("the memory agent (defaults: the paper's evaluation protocol)")
    agent.add_argument("--chunk-size", type=positive_int, default=5000, help="document tokens per memory turn (5000)")
    agent.add_argument("--max-new", type=positive_int, default=1024, help="max new tokens of a memory update (1024)")
    agent.add_argument(
        "--final-max-new",
        type=positive_int,
        default=1024,
        help="max new tokens of the answer (1024; a request's max_tokens replaces it)",
    )
    agent.add_argument(
        "--max-context",
        type=non_negative_int,
        default=0,
        help="keep the first and last halves of this many document tokens (0, the default: read the whole document)",
    )
    agent.add_argument(
        "--final-prompt",
        choices=tuple(FINAL_TEMPLATES),
        default="answer_is",
        help="the answer prompt: answer_is ('Therefore, the answer is ...', the paper's evaluation, default), boxed "
        "(\\boxed{}, the training format), boxed_released (what the released checkpoints saw in training)",
    )
    agent.add_argument(
        "--temperature",
        type=sampling_argument("temperature"),
        default=0.7,
        help="when a request gives none (paper: 0.7)",
    )
    agent.add_argument(
        "--top-p", type=sampling_argument("top_p"), default=0.95, help="when a request gives none (paper: 0.95)"
    )
    q = parser.add_argument_group("where the question is")
    q.add_argument(
        "--question-mode",
        choices=QUESTION_MODES,
        default="auto",
        help="field: memagent.document and memagent.question (or the last user message); messages: the document in "
        "earlier user messages, the question in the last; split: one message cut at --split-marker or else at its "
        "last blank line; auto (default): field if memagent.document is given, else messages if there are several "
        "user messages, else split",
    )
    q.add_argument("--split-marker", help="split mode: the question is the text after the last occurrence of this")
    q.add_argument(
        "--passthrough",
        action="store_true",
        help="a request whose messages fit in one chunk goes upstream as it is (plain model behaviour)",
    )
    svc = parser.add_argument_group("service")
    svc.add_argument("--host", default="127.0.0.1", help="interface to listen on (default 127.0.0.1)")
    svc.add_argument("--port", type=port, default=8000, help="port, 1-65535 (default 8000)")
    svc.add_argument("--max-documents", type=positive_int, default=4, help="documents in flight at once (default 4)")
    svc.add_argument(
        "--max-queue", type=non_negative_int, default=64, help="documents waiting beyond those (64); more: 503"
    )
    svc.add_argument("--queue-timeout", type=seconds, default=0.0, help="seconds a document may wait (0: no limit)")
    svc.add_argument("--document-timeout", type=seconds, default=0.0, help="seconds a document may run (0: no limit)")
    svc.add_argument(
        "--timeout", type=positive_seconds, default=600.0, help="seconds per upstream request attempt (default 600)"
    )
    svc.add_argument(
        "--timeout-per-token",
        type=seconds,
        default=0.0,
        help="seconds added to an attempt's timeout per prompt token (estimated) and per max_tokens (default 0)",
    )
    svc.add_argument(
        "--max-model-len",
        type=non_negative_int,
        default=0,
        help="the model's context in tokens: a request's max_tokens over it is 400, and it caps a turn's timeout "
        "(default 0: the tokenizer's model_max_length, else 131072)",
    )
    svc.add_argument("--max-retries", type=non_negative_int, default=2, help="retries of a failed upstream request (2)")
    svc.add_argument("--backoff", type=seconds, default=1.0, help="first retry delay in seconds, doubling (1)")
    svc.add_argument(
        "--shutdown-grace", type=seconds, default=30.0, help="seconds in-flight documents get after SIGTERM (30)"
    )
    svc.add_argument("--keepalive", type=seconds, default=15.0, help="seconds between stream keep-alives (15; 0: none)")
    svc.add_argument(
        "--spool-bytes",
        type=non_negative_int,
        default=SPOOL_BYTES,
        help=f"a request body over this many bytes is held on disk, not in memory (default {SPOOL_BYTES})",
    )
    svc.add_argument("--spool-dir", help="where a long request's files are made (default: the system's temp folder)")
    svc.add_argument(
        "--max-request-bytes",
        type=non_negative_int,
        default=MAX_REQUEST_BYTES,
        help=f"a request body over this many bytes is refused with 413 before it is read (default {MAX_REQUEST_BYTES}, "
        "64 MiB: a 3.5M-token document fits; 0: no limit)",
    )
    svc.add_argument(
        "--server-key-env", metavar="VAR", help="environment variable holding a key clients must send (Bearer)"
    )
    svc.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"), help="(info)")
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = build_parser()
    args = parse_with_config(parser, argv)
    if not args.model:
        parser.error("--model is required (the upstream's model name, or a local model without --upstream)")
    try:  # an unknown agent is refused before any server starts; loaded once, here (a file runs once)
        from recurrent.interface import load_register

        args.register = load_register(args.agent)
    except (ImportError, AttributeError, TypeError, FileNotFoundError) as err:
        parser.error(f"--agent {args.agent}: {err}")
    args.agent_values = {}
    if args.agent_config is not None:  # checked against the agent's config class before any server starts
        try:
            args.agent_values = agent_config(args.register, args.agent_config)
        except (ConfigError, OSError) as err:
            parser.error(f"--agent-config {err}" if isinstance(err, ConfigError) else f"--agent-config: {err}")
    for flag, var in (("--api-key-env", args.api_key_env), ("--server-key-env", args.server_key_env)):
        if var and not os.environ.get(var):
            parser.error(f"{flag} {var}: the environment variable {var} is not set")
    return args


def _tokenizer(args: argparse.Namespace, model_dir: str | None) -> Any:
    """The tokenizer of an agent whose registration says it needs one (it counts tokens); None for any other."""
    from recurrent.models import ModelNotAvailableError, load_tokenizer

    agent = args.register.name
    if not args.register.needs_tokenizer:
        return None
    name = args.tokenizer or model_dir or args.model
    try:
        return load_tokenizer(name)
    except (ModelNotAvailableError, OSError, ValueError) as err:
        hint = "" if args.tokenizer else f" (pass --tokenizer: agent {agent!r} counts tokens with the model's own)"
        raise SystemExit(f"error: no tokenizer for {name!r}{hint}: {err}") from None


class _Stop:
    """SIGTERM and SIGINT while the server starts or after it stopped: unwind (the local upstream is stopped on
    the way out). While it serves, uvicorn handles them (a drain), then raises the signal again once it has shut
    down: by then there is nothing left to do."""

    def __init__(self) -> None:
        self.service: Any = None

    def __call__(self, signum: int, frame: Any) -> None:
        if self.service is not None and self.service.stopped:
            return
        raise KeyboardInterrupt(f"signal {signum}")


def serve_settings(args: argparse.Namespace) -> ServeSettings:
    """The :class:`~taskutils.endpoint.service.ServeSettings` of parsed flags: a flag's 0 that means "no limit" (see
    its help) becomes None, which the settings take for no limit (they refuse a limit of 0)."""
    from taskutils.endpoint.service import ServeSettings

    return ServeSettings(
        model=args.served_model_name or args.model,
        agent=args.agent,
        agent_config=args.agent_values,
        chunk_size=args.chunk_size,
        max_new=args.max_new,
        final_max_new=args.final_max_new,
        max_context=args.max_context or None,
        final_prompt=args.final_prompt,
        question_mode=args.question_mode,
        split_marker=args.split_marker,
        passthrough=args.passthrough,
        temperature=args.temperature,
        top_p=args.top_p,
        max_documents=args.max_documents,
        max_queue=args.max_queue,
        queue_timeout=args.queue_timeout or None,
        document_timeout=args.document_timeout or None,
        shutdown_grace=args.shutdown_grace,
        keepalive=args.keepalive or None,
        spool_bytes=args.spool_bytes,
        spool_dir=args.spool_dir,
        max_request_bytes=args.max_request_bytes or None,
        max_model_len=args.max_model_len or None,
        server_key=os.environ[args.server_key_env] if args.server_key_env else None,
    )


def serve(args: argparse.Namespace, stop: _Stop) -> int:
    from recurrent.client import OpenAIChatClient
    from recurrent.local_server import ServerError, transformers_serve
    from recurrent.models import ModelNotAvailableError, resolve_model_path
    from taskutils.endpoint.app import build_app
    from taskutils.endpoint.service import MemAgentService

    log = logging.getLogger("taskutils.endpoint")
    with contextlib.ExitStack() as stack:
        model_dir = None
        if args.upstream:
            upstream, upstream_model = args.upstream, args.model
        else:
            try:
                model_dir = resolve_model_path(args.model)
            except ModelNotAvailableError as err:
                print(f"error: {err}\nOr serve it yourself (vllm serve ...) and pass --upstream.", file=sys.stderr)
                return 2
        tokenizer = _tokenizer(args, model_dir)
        if model_dir is not None:
            log.info("starting transformers serve for %s (%s)", args.model, model_dir)
            try:
                local = stack.enter_context(
                    transformers_serve(model_dir, startup_timeout=args.ready_timeout, log_path=args.server_log)
                )
            except (ServerError, OSError) as err:
                print(f"error: the local server did not start: {err}", file=sys.stderr)
                return 1
            upstream, upstream_model = local.base_url, local.model
        api_key = os.environ[args.api_key_env] if args.api_key_env else None
        settings = serve_settings(args)
        client = OpenAIChatClient(
            upstream,
            upstream_model,
            api_key=api_key,
            max_concurrency=args.max_documents,  # one request at a time per document
            timeout=args.timeout,
            timeout_per_token=args.timeout_per_token,
            max_retries=args.max_retries,
            backoff=args.backoff,
        )
        try:
            service = MemAgentService(settings, tokenizer, client, args.register)
        except (ValueError, TypeError) as err:  # the agent cannot be built with these settings
            print(f"error: --agent {args.agent}: {err}", file=sys.stderr)
            return 2
        log.info(
            "model %r: upstream %s (model %r); %s", settings.model, client.base_url, upstream_model, service.describe()
        )
        config = uvicorn.Config(
            build_app(service), host=args.host, port=args.port, log_level=args.log_level, lifespan="on"
        )
        server = DrainingServer(config, service)
        stop.service = service
        server.run()
        if not service.stopped:  # uvicorn could not start (a port in use): it said why
            return 1
    return 0


class DrainingServer(uvicorn.Server):
    """uvicorn's server, with SIGTERM and Ctrl-C first draining the documents in flight (``--shutdown-grace``)."""

    def __init__(self, config: uvicorn.Config, service: Any) -> None:
        super().__init__(config)
        self.service = service

    def handle_exit(self, sig: int, frame: Any) -> None:
        if self.service.loop is not None:  # a signal handler: the drain starts on the loop, not in here
            self.service.loop.call_soon_threadsafe(self.service.begin_drain)
        super().handle_exit(sig, frame)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never a download at run time
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("httpx", "httpx2", "openai"):
        logging.getLogger(noisy).setLevel(logging.WARNING)  # request lines: not needed, and never keys
    stop = _Stop()
    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        return serve(args, stop)
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
