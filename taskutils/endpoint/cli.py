"""``python -m taskutils.endpoint``: the command line of the MemAgent server, serving any registered agent
(docs/serving.md)."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import uvicorn

from recurrent.agent_thread import DOCUMENT_DEADLINE_S, deadline_argument
from recurrent.flags import ClientOptions, SamplingOptions, add_flags, flag, from_args
from recurrent.impls.memory import FINAL_TEMPLATES
from recurrent.options import (
    ConfigError,
    agent_config,
    non_negative_int,
    parse_with_config,
    positive_int,
    positive_seconds,
    seconds,
)
from recurrent.options import port as port_number
from recurrent.sampling import describe_rule
from taskutils.endpoint.connections import ConnectionLimits
from taskutils.endpoint.questions import QUESTION_MODES
from taskutils.endpoint.spool import MAX_REQUEST_BYTES, SPOOL_BYTES

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


@dataclass(frozen=True)
class UpstreamOptions:
    """The model behind the server: an upstream's, or a local one started for it; the agent that serves it."""

    model: str | None = flag(
        None,
        "with --upstream: the model name the upstream serves; without: a model available offline, served locally by "
        "transformers serve (required)",
    )
    upstream: str | None = flag(None, "base URL of an OpenAI-compatible server (vLLM, a hosted API), e.g. .../v1")
    api_key_env: str | None = flag(
        None,
        "environment variable holding the upstream's API key (default: API_KEY if set); never logged",
        metavar="VAR",
    )
    tokenizer: str | None = flag(
        None,
        "tokenizer folder or cached hub id, for an agent that counts tokens (the memory agent's chunks, the direct "
        "agent's truncation; default: the model's; required then for an upstream model that is not available "
        "offline); an agent that needs none loads none",
    )
    served_model_name: str | None = flag(None, "the model name clients use (default: --model)")
    server_log: Path | None = flag(None, "without --upstream: the local server's log (default: a temp file)", type=Path)
    ready_timeout: float = flag(
        300.0, "seconds for the local server to start; a finite number > 0 (default %(default)s)", type=positive_seconds
    )
    agent: str = flag(
        "memory",
        "the agent to serve: a registered name (memory, direct, calculator, ...), a module path, or a file path "
        "(path/to/agent.py, relative to the working directory); default memory: each request's document is read by "
        "the memory agent",
    )
    agent_config: Path | None = flag(
        None,
        "YAML or JSON file of the agent's config fields (its config class; relative to the working directory), set "
        "over its defaults; for the memory agent, over the budgets below",
        type=Path,
        metavar="FILE",
    )


@dataclass(frozen=True)
class MemoryAgentOptions:
    """The memory agent's budgets and answer prompt: the paper's evaluation protocol (the harness's memory method)."""

    chunk_size: int = flag(5000, "document tokens per memory turn (%(default)s)", type=positive_int)
    max_new: int = flag(1024, "max new tokens of a memory update (%(default)s)", type=positive_int)
    final_max_new: int = flag(
        1024, "max new tokens of the answer (%(default)s; a request's max_tokens replaces it)", type=positive_int
    )
    max_context: int = flag(
        0,
        "keep the first and last halves of this many document tokens (0, the default: read the whole document)",
        type=non_negative_int,
    )
    final_prompt: str = flag(
        "answer_is",
        "the answer prompt: answer_is ('Therefore, the answer is ...', the paper's evaluation, default), boxed "
        "(\\boxed{}, the training format), boxed_released (what the released checkpoints saw in training)",
        choices=FINAL_TEMPLATES,
    )


@dataclass(frozen=True)
class QuestionOptions:
    """Where a request's question is (docs/serving.md, "Where the question is")."""

    question_mode: str = flag(
        "auto",
        "field: memagent.document and memagent.question (or the last user message); messages: the document in "
        "earlier user messages, the question in the last; split: one message cut at --split-marker or else at its "
        "last blank line; auto (default): field if memagent.document is given, else messages if there are several "
        "user messages, else split",
        choices=QUESTION_MODES,
    )
    split_marker: str | None = flag(None, "split mode: the question is the text after the last occurrence of this")
    passthrough: bool = flag(
        False, "a request whose messages fit in one chunk goes upstream as it is (plain model behaviour)"
    )


@dataclass(frozen=True)
class ServiceOptions:
    """The service's address, limits and drain (docs/serving.md, "A service")."""

    host: str = flag("127.0.0.1", "interface to listen on (default %(default)s)")
    port: int = flag(8000, "port, 1-65535 (default %(default)s)", type=port_number)
    max_documents: int = flag(4, "documents in flight at once (default %(default)s)", type=positive_int)
    max_queue: int = flag(64, "documents waiting beyond those (%(default)s); more: 503", type=non_negative_int)
    queue_timeout: float = flag(0.0, "seconds a document may wait (0: no limit)", type=seconds)
    document_timeout: float = flag(
        DOCUMENT_DEADLINE_S,
        "seconds a document may run, whatever its agent does (default %(default)g: the longest paper document at 20 s "
        "a call; 0: no limit)",
        type=deadline_argument,
    )
    max_model_len: int = flag(
        0,
        "the model's context in tokens: a request's max_tokens over it is 400, and it caps a turn's timeout (default "
        "0: the tokenizer's model_max_length, else 131072)",
        type=non_negative_int,
    )
    shutdown_grace: float = flag(30.0, "seconds in-flight documents get after SIGTERM (%(default)s)", type=seconds)
    keepalive: float = flag(15.0, "seconds between stream keep-alives (%(default)s; 0: none)", type=seconds)
    spool_bytes: int = flag(
        SPOOL_BYTES,
        "a request body over this many bytes is held on disk, not in memory (default %(default)s)",
        type=non_negative_int,
    )
    spool_dir: str | None = flag(None, "where a long request's files are made (default: the system's temp folder)")
    max_request_bytes: int = flag(
        MAX_REQUEST_BYTES,
        "a request body over this many bytes is refused with 413 before it is read (default %(default)s, 64 MiB: a "
        "3.5M-token document fits; 0: no limit)",
        type=non_negative_int,
    )
    max_header_bytes: int = flag(
        ConnectionLimits.max_header_bytes,
        "a request's head (request line and headers) over this many bytes is refused with 431 (default %(default)s)",
        type=positive_int,
    )
    max_headers: int = flag(
        ConnectionLimits.max_headers, "a request with more headers is refused with 431 (%(default)s)", type=positive_int
    )
    header_timeout: float = flag(
        ConnectionLimits.header_timeout,
        "seconds for a request's head to arrive, from the connection's opening or the previous answer; a slower "
        "connection is closed (default %(default)s)",
        type=positive_seconds,
    )
    body_timeout: float = flag(
        ConnectionLimits.body_timeout,
        "seconds for a request's body to arrive once its head has; a slower connection is closed (default "
        "%(default)s: 64 MiB at 220 KB/s)",
        type=positive_seconds,
    )
    idle_timeout: float = flag(
        ConnectionLimits.idle_timeout,
        "seconds a kept-alive connection may wait for its next request (default %(default)s)",
        type=positive_seconds,
    )
    max_connections: int = flag(
        0,
        "connections open at once; past it a new one closes the oldest idle or half-sent one (default 0: the "
        "open-file limit less what the server and its documents may open)",
        type=non_negative_int,
    )
    max_uploads: int = flag(
        0,
        "connections sending a request's body at once; past it a new one has the oldest answered 503 and closed "
        "(default 0: --max-documents + --max-queue)",
        type=non_negative_int,
    )
    server_key_env: str | None = flag(
        None, "environment variable holding a key clients must send (Bearer)", metavar="VAR"
    )
    log_level: str = flag("info", "(%(default)s)", choices=("debug", "info", "warning", "error"))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m taskutils.endpoint",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", type=Path, help="YAML file of defaults for these options (keys as the long flags)")
    add_flags(parser.add_argument_group("model and upstream"), UpstreamOptions)
    agent = parser.add_argument_group(
        "the memory agent (defaults: the paper's evaluation protocol)",
        "--temperature and --top-p: the sampling of a request that gives none",
    )
    add_flags(agent, MemoryAgentOptions)
    add_flags(agent, SamplingOptions)
    add_flags(parser.add_argument_group("where the question is"), QuestionOptions)
    add_flags(parser.add_argument_group("service"), ServiceOptions)
    add_flags(parser.add_argument_group("upstream requests"), ClientOptions)
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
    for option, var in (("--api-key-env", args.api_key_env), ("--server-key-env", args.server_key_env)):
        if var and not os.environ.get(var):
            parser.error(f"{option} {var}: the environment variable {var} is not set")
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


def connection_limits(args: argparse.Namespace) -> ConnectionLimits:
    """The :class:`~taskutils.endpoint.connections.ConnectionLimits` of parsed flags (``--max-connections 0``: from
    the open-file limit, None)."""
    return ConnectionLimits(
        max_header_bytes=args.max_header_bytes,
        max_headers=args.max_headers,
        header_timeout=args.header_timeout,
        body_timeout=args.body_timeout,
        idle_timeout=args.idle_timeout,
        max_connections=args.max_connections or None,
        max_uploads=args.max_uploads or None,
    )


def serve(args: argparse.Namespace, stop: _Stop) -> int:
    from recurrent.client import OpenAIChatClient
    from recurrent.local_server import ServerError, transformers_serve
    from recurrent.models import ModelNotAvailableError, resolve_model_path
    from taskutils.endpoint.app import build_app
    from taskutils.endpoint.connections import (
        Connections,
        connection_bound,
        raise_open_file_limit,
        server_config,
        upload_bound,
    )
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
            **asdict(from_args(ClientOptions, args)),
        )
        try:
            service = MemAgentService(settings, tokenizer, client, args.register)
        except (ValueError, TypeError) as err:  # the agent cannot be built with these settings
            print(f"error: --agent {args.agent}: {err}", file=sys.stderr)
            return 2
        raise_open_file_limit()  # connections are files: as many as this machine lets a process open
        try:
            bound = connection_bound(connection_limits(args), args.max_documents, args.max_queue)
        except ValueError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        uploads = upload_bound(connection_limits(args), args.max_documents, args.max_queue)
        service.connections = Connections(connection_limits(args), bound, uploads)
        log.info(
            "model %r: upstream %s (model %r); %s; at most %d connections, %d of them sending a body",
            settings.model,
            client.base_url,
            upstream_model,
            service.describe(),
            bound,
            uploads,
        )
        defaults = {"temperature": settings.temperature, "top_p": settings.top_p}
        log.info("%s", describe_rule(defaults, "--temperature, --top-p: the paper's evaluation by default"))
        config = server_config(
            build_app(service), service.connections, host=args.host, port=args.port, log_level=args.log_level,
            lifespan="on",
        )  # fmt: skip
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
