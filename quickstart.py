"""Quickstart: a memory agent reads a document chunk by chunk, overwriting its memory, then answers.

    python quickstart.py                       # CPU, no set-up beyond `make setup`: SmolLM2-135M-Instruct
                                               # behind a local `transformers serve`, the bundled example
    vllm serve BytedTsinghua-SIA/RL-MemoryAgent-14B --tensor-parallel-size 2
    URL=http://localhost:8000/v1 python quickstart.py --model BytedTsinghua-SIA/RL-MemoryAgent-14B
    URL=https://{endpoint} API_KEY=... python quickstart.py --model gpt-4o-2024-11-20 --tokenizer PATH
    URL=https://{endpoint}/openai/deployments/{name}?api-version=... API_KEY=... python quickstart.py --model NAME

Without ``URL`` (an empty one counts as unset), a ``--model`` that ``http://localhost:8000/v1`` serves is used
there, as the original quickstart's default URL (so ``vllm serve MODEL`` then ``python quickstart.py --model MODEL``
runs as typed); any other model must be available offline (a local folder, ``tiny``, ``smollm2-135m-instruct``, or
a hub id already in the Hugging Face cache): a local ``transformers serve`` is started for it and stopped at the
end. With ``URL`` (and ``API_KEY``) the endpoint is used as is: a local vLLM server, an online service or an
Azure deployment. The API key is never printed.

The memory agent is the one of ``recurrent.impls.memory`` (the prompts the released checkpoints were trained
with, the boxed final answer as in the original quickstart). The document is cut into ``--chunk``-token chunks
with the model's tokenizer; ``--max-new`` caps both every memory update and the answer, as the original does.

``--agent NAME_OR_PATH`` runs another agent from the registry instead: a registered name (``calculator``) or an
agent file anywhere (``path/to/my_agent.py``, relative to the working directory; docs/write_your_own_agent.md),
on its own settings' defaults. It gets the question as ``input`` (and ``prompt``) and the document as ``context``;
every model call and the answer are printed, and the answer is read from its ``\boxed{}``.

    URL=http://localhost:8000/v1 python quickstart.py --model NAME --agent my_agent.py --question "What is 6 times 7?"

Exit status: 0 when the agent ran to its answer (shown, or the reply when none could be extracted); 1 when it could
not (a request that failed after its retries, a server that did not start); 2 on a bad option or setting (a model not
available offline; a ``--context-file`` over 64 MiB or not UTF-8 text; a ``--trace`` it cannot write, said before
any work; ``--timeout`` must be a finite number of seconds > 0, ``--timeout-per-token`` and ``--backoff``
finite numbers >= 0: the client options of every command, ``recurrent/flags.py``); 130 when interrupted (Ctrl-C), 143
when stopped by SIGTERM (128 + 15, the shells' convention).
"""

# No `from __future__ import annotations`: the dataclasses below must build when this file is loaded as a module by
# path (importlib, as the tests do), which string annotations would need sys.modules for.
import argparse
import asyncio
import contextlib
import functools
import logging
import os
import re
import signal
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from recurrent.bounded_read import read_text
from recurrent.flags import ClientOptions, SamplingOptions, add_flags, flag, from_args  # this folder is on sys.path
from recurrent.options import non_negative_int, positive_int
from recurrent.sampling import argument as sampling_argument

HERE = Path(__file__).resolve().parent
DEFAULT_MODEL = "smollm2-135m-instruct"
DEFAULT_DOCUMENT = HERE / "examples" / "quickstart_document.txt"
DEFAULT_QUESTION = "What is the magic number?"
# The embedded CPU models get a chunk size that gives the bundled ~1.8K-token example several chunks and a memory
# cap a 135M model on 2 cores writes in seconds; any other model gets the original quickstart's 5000 / 1024.
CPU_CHUNK, CPU_MAX_NEW = 500, 64
PAPER_CHUNK, PAPER_MAX_NEW = 5000, 1024
MAX_CONTEXT = 120000  # the original quickstart keeps the first and last 60K tokens of longer documents
SHOWN_CHARS = 200  # of a reply's first sentence, shown when no answer can be extracted
DEFAULT_SERVER_LOG = HERE / ".cache" / "logs" / "quickstart-transformers-serve.log"
ORIGINAL_URL = "http://localhost:8000/v1"  # the original quickstart's default, where `vllm serve` listens
# The longest --context-file read: the endpoint's request limit (docs/serving.md), a 3.5M-token document. Anything
# longer (or a device such as /dev/zero, which never ends) is refused before it is held in memory.
MAX_DOCUMENT_BYTES = 64 << 20


@dataclass(frozen=True)
class QuickstartOptions:
    """What the quickstart reads and asks, with which agent and budgets (the sampling and the client's options are
    every command's, recurrent/flags.py)."""

    model: str | None = flag(
        None,
        f"with URL: the model name the endpoint serves; without URL: a model available offline, served locally "
        f"(default: {DEFAULT_MODEL})",
    )
    agent: str = flag(
        "memory",
        "the agent: a registered name or the path of an agent file (default: memory, the memory agent; the options "
        "--chunk, --max-new, --final-prompt and --max-context are the memory agent's)",
    )
    chunk: int | None = flag(
        None,
        f"context tokens per chunk (default: {CPU_CHUNK} for the embedded CPU models, else {PAPER_CHUNK})",
        type=positive_int,
    )
    max_new: int | None = flag(
        None,
        f"max new tokens of every memory update and of the answer (default: {CPU_MAX_NEW} for the embedded CPU "
        f"models, else {PAPER_MAX_NEW}; also --max_new, the original's spelling)",
        type=positive_int,
        aliases=("--max_new",),
    )
    context_file: Path = flag(DEFAULT_DOCUMENT, "the document (a text file)", type=Path)
    question: str = flag(DEFAULT_QUESTION, "the question (default: %(default)r)")
    trace: Path | None = flag(None, "append the run's trace (memory after each chunk, tokens) as JSONL", type=Path)
    tokenizer: str | None = flag(
        None,
        "tokenizer folder or cached hub id for chunking (default: the model's; for a hosted model that is not "
        "available offline, the SmolLM2 tokenizer, with a note)",
    )
    final_prompt: str | None = flag(
        None,
        "answer format: the paper's evaluation prompt ('Therefore, the answer is ...', the default for the embedded "
        "CPU models, which were never trained to box) or the training prompt's \\boxed{} (the default for other "
        "models, as in the original quickstart)",
        choices=("boxed", "answer_is"),
    )
    max_context: int | None = flag(
        None,
        f"keep the first and last halves of this many document tokens (default {MAX_CONTEXT}; 0: no cap)",
        type=non_negative_int,
    )
    seed: int | None = flag(
        None,
        "sampling seed per request (default: 0 for the embedded CPU models, so the demo repeats; none otherwise)",
        type=sampling_argument("seed"),
    )
    server_log: Path = flag(
        DEFAULT_SERVER_LOG,
        f"without URL: the local server's log (default: {DEFAULT_SERVER_LOG.relative_to(HERE)} in the repository)",
        type=Path,
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python quickstart.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_flags(parser, QuickstartOptions, skip=["seed", "server_log"])
    sampling = parser.add_argument_group("sampling")
    add_flags(sampling, SamplingOptions)
    add_flags(sampling, QuickstartOptions, only=["seed"])
    requests = parser.add_argument_group("requests and the local server")
    add_flags(requests, ClientOptions)
    add_flags(requests, QuickstartOptions, only=["server_log"])
    return parser


def original_default_url(model: str, url: str | None = None) -> str | None:
    """``url`` (default :data:`ORIGINAL_URL`, the original quickstart's default URL) when a server there lists
    ``model`` (the original's ``vllm serve MODEL`` then ``python quickstart.py --model MODEL``), else None."""
    from taskutils.memory_eval.model_servers import served_models

    url = url or ORIGINAL_URL
    if model not in (served_models(url, timeout=2.0) or []):
        return None
    print(f"URL is not set: {url}, the original quickstart's default, serves {model}", file=sys.stderr)
    return url


def endpoint_tokenizer(args: argparse.Namespace, model: str) -> Any:
    """The tokenizer to chunk with when the model is behind a URL (it may not exist locally)."""
    from recurrent.models import ModelNotAvailableError, load_tokenizer

    if args.tokenizer:
        return load_tokenizer(args.tokenizer)
    try:
        return load_tokenizer(model)
    except (ModelNotAvailableError, OSError, ValueError):
        print(
            f"note: no local tokenizer for {model!r}; chunks are counted with {DEFAULT_MODEL}'s tokenizer "
            "(pass --tokenizer to choose)",
            file=sys.stderr,
        )
        return load_tokenizer(DEFAULT_MODEL)


def show(title: str, text: str) -> None:
    print(f"\n--- {title}")
    print(text.strip() or "(empty)", flush=True)


def show_turn(chunks: int, turn: Any, reply: Any) -> None:
    """Print one finished turn: the memory after a chunk, or the final answer (``run_session``'s ``on_turn``)."""
    cut = ", cut at the cap" if reply.finish_reason == "length" else ""
    facts = f"{reply.completion_tokens} tokens, {reply.seconds:.1f} s{cut}"
    if turn.final:
        show(f"final answer ({facts})", reply.text)
    else:
        chunk = turn.meta["chunk"]
        show(f"memory after chunk {chunk + 1}/{chunks} ({turn.meta['chunk_tokens']} tokens read; {facts})", reply.text)


def show_call(turn: Any, reply: Any) -> None:
    """Print one finished model call of an agent other than the memory agent (``run_session``'s ``on_turn``)."""
    cut = ", cut at the cap" if reply.finish_reason == "length" else ""
    kind = turn.meta.get("kind", "call")
    show(f"{kind} ({reply.completion_tokens} tokens, {reply.seconds:.1f} s{cut})", reply.text)


MEMORY_ONLY = ("chunk", "max_new", "final_prompt", "max_context")  # options of the memory agent alone


def load_agent(args: argparse.Namespace) -> tuple[Any, bool]:
    """The agent's registration (by name or file, through the registry's loader) and whether it is the memory
    agent. Raises ``ValueError`` naming the agent or the option that does not apply to it."""
    from recurrent.interface import load_register

    try:
        register = load_register(args.agent)
    except (ImportError, AttributeError, TypeError, OSError, SyntaxError) as err:
        raise ValueError(f"--agent {args.agent}: {err}") from err
    memory = register is load_register("memory")
    given = [f"--{name.replace('_', '-')}" for name in MEMORY_ONLY if getattr(args, name) is not None]
    if not memory and given:
        raise ValueError(f"{', '.join(given)}: options of the memory agent, not of --agent {args.agent}")
    return register, memory


def shown_answer(response: str, final_prompt: str) -> tuple[str, str | None]:
    """The answer to print and, when the scorer's own extraction found none, a note on what was shown instead.

    The scorer's rules (taskutils.verifiers): the last ``\\boxed{}`` for the boxed prompt; for the paper's
    prompt, the text after the last lower-case "the answer is" (case-sensitive, as the paper's evaluation). A
    small model that writes "The answer is ..." or just states the answer would show nothing: then the phrase in
    any case, else the reply's first sentence, is shown, with a note that a scorer would not have read it."""
    from taskutils.verifiers import extract_answer, final_text, last_boxed_answer

    text = final_text(response)
    strict = last_boxed_answer(text) if final_prompt == "boxed" else extract_answer(text)
    if strict:
        return strict, None
    found = (extract_answer(_any_case(text)) or "").strip("\"'")
    if found:
        return found, "found by 'the answer is' in any case: the paper's scorer reads only the lower-case phrase"
    expected = "no \\boxed{} and no 'the answer is'" if final_prompt == "boxed" else "no 'the answer is'"
    first = re.split(r"(?<=[.!?])\s|\n", text.strip(), maxsplit=1)[0][:SHOWN_CHARS]
    if first:
        return first, f"the reply's first sentence: it has {expected}, so a scorer would count it wrong"
    return "(none extracted)", "the reply is empty: a scorer would count it wrong"


def _any_case(text: str) -> str:
    """``text`` with every "the answer is", in any case, written in lower case (the rest untouched)."""
    return re.sub(r"the answer is", "the answer is", text, flags=re.IGNORECASE)


@dataclass(frozen=True)
class Budgets:
    """The memory agent's budgets and answer format of this run, its seed: the flags, else the defaults of the
    embedded CPU models or of any other model."""

    chunk: int
    max_new: int
    final_prompt: str
    max_context: int
    seed: int | None

    @classmethod
    def of(cls, args: argparse.Namespace, embedded: bool) -> "Budgets":
        def given(value: Any, cpu: Any, other: Any) -> Any:
            return value if value is not None else (cpu if embedded else other)

        return cls(
            chunk=given(args.chunk, CPU_CHUNK, PAPER_CHUNK),
            max_new=given(args.max_new, CPU_MAX_NEW, PAPER_MAX_NEW),
            final_prompt=given(args.final_prompt, "answer_is", "boxed"),
            max_context=MAX_CONTEXT if args.max_context is None else args.max_context,
            seed=given(args.seed, 0, None),
        )


def open_endpoint(
    stack: contextlib.ExitStack, args: argparse.Namespace, url: str | None, model: str, model_dir: str | None
) -> tuple:
    """``(tokenizer, base_url, served model name)``: the URL's endpoint, or a local ``transformers serve`` for an
    offline model's folder, stopped when ``stack`` closes."""
    from recurrent.local_server import transformers_serve
    from recurrent.models import load_tokenizer

    if url:
        tokenizer = endpoint_tokenizer(args, model)
        print(f"endpoint: {url} (model {model})")
        return tokenizer, url, model
    tokenizer = load_tokenizer(args.tokenizer or model_dir)
    print(f"starting transformers serve for {model} ({model_dir}) ...", flush=True)
    start = time.perf_counter()
    server = stack.enter_context(transformers_serve(model_dir, log_path=args.server_log))
    print(
        f"server ready at {server.base_url} in {time.perf_counter() - start:.1f} s (pid {server.process.pid}, "
        f"log {args.server_log})",
        flush=True,
    )
    return tokenizer, server.base_url, server.model


def make_session(
    args: argparse.Namespace, register: Any, memory: bool, tokenizer: Any, budgets: Budgets, document: str
) -> tuple:
    """``(session, on_turn, final_prompt)``: the episode of the document and question, what is printed after each
    model call, and the answer format it is read with."""
    question = args.question.strip()
    if memory:
        options = {"chunk_size": budgets.chunk, "max_new": budgets.max_new, "final_max_new": budgets.max_new}
        options |= {"max_context": budgets.max_context or None, "final_prompt": budgets.final_prompt}
        session = register.for_inference(tokenizer, **options).episode({"input": question, "context": document})
        print(
            f"document: {args.context_file.name}, {session.original_context_tokens} tokens -> "
            f"{session.num_chunks} chunk(s) of up to {budgets.chunk}; memory and answer capped at {budgets.max_new} "
            "new tokens"
        )
        on_turn, final_prompt = functools.partial(show_turn, session.num_chunks), budgets.final_prompt
    else:
        sample = {"input": question, "prompt": question, "context": document}
        session = register.for_inference(tokenizer).episode(sample)
        print(f"agent: {register.name} ({args.agent}); document: {args.context_file.name}")
        on_turn, final_prompt = show_call, "boxed"  # how the harness scores another agent's answer
    print(f"question: {question}")
    return session, on_turn, final_prompt


def print_result(
    args: argparse.Namespace, session: Any, stats: Any, final_prompt: str, seconds: tuple, trace: Any
) -> None:
    """The answer (and how it was found), the time, the tokens; the trace when asked (``trace``: its writer, opened
    before the run). ``seconds``: the agent's and the whole run's."""
    answer, how = shown_answer(session.answer or "", final_prompt)
    print(f"\nAnswer: {answer}")
    if how:
        print(f"        ({how})")
    agent_seconds, all_seconds = seconds
    calls = len(session.history)
    print(f"Time: {agent_seconds:.1f} s for {calls} model calls ({all_seconds:.1f} s in all, server start included)")
    print(
        f"Tokens: {stats.prompt_tokens:,d} prompt + {stats.completion_tokens:,d} completion = "
        f"{stats.prompt_tokens + stats.completion_tokens:,d}"
    )
    if trace is not None:
        trace.write_sample("quickstart", session, None, agent_seconds)
        print(f"Trace: {args.trace}")


def open_trace(path: Path) -> Any:
    """The trace's writer (``recurrent.trace.TraceWriter``, appending); ``ValueError`` naming ``--trace`` when the
    path cannot be written (a folder, a file under a file, no permission)."""
    from recurrent.trace import TraceWriter

    try:
        return TraceWriter(path)
    except OSError as err:
        where = f" ({err.filename})" if err.filename and str(err.filename) != str(path) else ""
        raise ValueError(f"--trace {path}: cannot be written: {err.strerror or err}{where}") from None


def run(args: argparse.Namespace) -> int:
    """The quickstart: its inputs checked before any work (the document read with its bound, the trace opened), then
    :func:`answer`."""
    with contextlib.ExitStack() as files:
        try:
            document = read_text(args.context_file, MAX_DOCUMENT_BYTES, "--context-file", "the quickstart's limit")
            # Opened now (its folders made): a path it cannot write is said before the run, not after it.
            trace = files.enter_context(open_trace(args.trace)) if args.trace else None
        except ValueError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        return answer(args, document, trace)


def answer(args: argparse.Namespace, document: str, trace: Any) -> int:
    """The agent's run over ``document`` against the URL's endpoint or a local server, its answer printed."""
    from recurrent.async_manager import run_session
    from recurrent.client import OpenAIChatClient
    from recurrent.models import KNOWN_MODELS, ModelNotAvailableError, resolve_model_path

    url = os.environ.get("URL") or None  # an empty URL= is unset
    if url and not args.model:
        print("error: URL is set: pass --model, the model name the endpoint serves", file=sys.stderr)
        return 2
    if not url and args.model and args.model not in KNOWN_MODELS:
        url = original_default_url(args.model)
    try:
        register, memory = load_agent(args)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    model = args.model or DEFAULT_MODEL
    budgets = Budgets.of(args, embedded=model in KNOWN_MODELS)
    with contextlib.ExitStack() as stack:
        start = time.perf_counter()
        try:
            model_dir = None if url else resolve_model_path(model)
        except ModelNotAvailableError as err:
            print(
                f"error: {err}\nOr serve it at {ORIGINAL_URL} (the original's default URL: vllm serve {model}), "
                "or set URL (and API_KEY) to the endpoint that serves it.",
                file=sys.stderr,
            )
            return 2
        tokenizer, base_url, served = open_endpoint(stack, args, url, model, model_dir)
        session, on_turn, final_prompt = make_session(args, register, memory, tokenizer, budgets, document)
        options = asdict(from_args(ClientOptions, args))
        client = OpenAIChatClient(base_url, served, max_concurrency=1, **options)
        sampling = asdict(from_args(SamplingOptions, args))
        if budgets.seed is not None:
            sampling["seed"] = budgets.seed
        began = time.perf_counter()

        async def main() -> None:
            async with client:
                await run_session(session, client, sampling, on_turn=on_turn)

        asyncio.run(main())
        agent_seconds = time.perf_counter() - began
    print_result(args, session, client.stats, final_prompt, (agent_seconds, time.perf_counter() - start), trace)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    sys.path.insert(0, str(HERE))  # run from anywhere: the project's packages live next to this file
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never a download at run time
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # tokenizer-loading chatter is not what a user came to read
    terminated = False

    def _interrupt(signum: int, frame: Any) -> None:
        # SIGTERM (a scheduler, `kill`) unwinds like Ctrl-C: the local server is stopped on the way out.
        nonlocal terminated
        terminated = True
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        return run(args)
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 128 + signal.SIGTERM if terminated else 130  # the shells' convention: 128 + the signal
    except (RuntimeError, TimeoutError, OSError) as err:
        # A clear message, not a traceback: requests that failed after the retries (ChatRequestError), a server
        # that did not start, a missing --context-file.
        print(f"error: {err}", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
