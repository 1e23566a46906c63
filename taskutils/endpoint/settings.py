"""What an endpoint answers with (:class:`ServeSettings`, the command line's flags: taskutils/endpoint/cli.py) and the
model's context it assumes (:func:`context_length`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from recurrent.agent_thread import DOCUMENT_DEADLINE_S
from recurrent.impls.memory import FINAL_TEMPLATES
from taskutils.endpoint.questions import QUESTION_MODES
from taskutils.endpoint.spool import MAX_REQUEST_BYTES, SPOOL_BYTES

# The model's context when neither --max-model-len nor the tokenizer tells it (a tokenizer without a real
# model_max_length, an agent without a tokenizer): 128K tokens, the longest native context of the model families
# served here (docs/serving.md, "What a request costs").
DEFAULT_MODEL_LEN = 131_072
# A tokenizer's model_max_length above this is transformers' "unknown" placeholder (int(1e30)), not a context.
KNOWN_MODEL_LEN = 1 << 24


@dataclass(frozen=True)
class ServeSettings:
    """What a server answers with. Budgets and prompt default to the paper's evaluation protocol (the harness's
    ``memory`` method): 5000-token chunks, 1024-token memory and answer, the whole document, "the answer is"."""

    model: str  # the name clients use (GET /v1/models lists it)
    agent: str = "memory"  # a registered agent's name, or a module or file path (recurrent.interface.load_register)
    # The agent's config fields (--agent-config), set over its inference settings.
    agent_config: Mapping[str, Any] = field(default_factory=dict)
    # The budgets below go to an agent with its own inference builder (the memory agent's); other agents run on
    # their config (docs/serving.md, "Another agent").
    chunk_size: int = 5000
    max_new: int = 1024  # cap on a memory update
    final_max_new: int = 1024  # cap on the answer (a request's max_tokens replaces it)
    max_context: int | None = None  # centre-truncate documents to this many tokens; None: read all
    final_prompt: str = "answer_is"
    question_mode: str = "auto"
    split_marker: str | None = None
    passthrough: bool = False  # a request that fits in one chunk goes upstream as it is
    temperature: float | None = 0.7  # used when a request gives none (the paper's sampling)
    top_p: float | None = 0.95
    max_documents: int = 4  # documents in flight (each has at most one upstream request at a time)
    max_queue: int = 64  # documents waiting for a slot; beyond that: 503
    queue_timeout: float | None = None  # seconds a document may wait for a slot; None: as long as its client
    # Seconds a document may run, whatever its agent does (its code runs in a thread of its own:
    # recurrent/agent_thread.py); None: no limit.
    document_timeout: float | None = DOCUMENT_DEADLINE_S
    shutdown_grace: float = 30.0  # seconds documents in flight get to finish after SIGTERM
    keepalive: float | None = 15.0  # seconds between SSE comments while a streamed document reads; None: none
    spool_bytes: int = SPOOL_BYTES  # a longer request body is held on disk (docs/serving.md, "Long requests")
    max_request_bytes: int | None = MAX_REQUEST_BYTES  # a longer request body is refused (413); None: no limit
    spool_dir: str | None = None  # where its files are made (unlinked at once); None: the system's temp folder
    spool_string_chars: int = 65_536  # in a body on disk, a longer string stays on disk
    tokenize_window: int = 64_000  # a document on disk is tokenized this many characters at a time
    # The model's context in tokens: a request's max_tokens over it is 400; it caps an attempt's timeout. None:
    # the tokenizer's model_max_length, else DEFAULT_MODEL_LEN (context_length).
    max_model_len: int | None = None
    server_key: str | None = field(default=None, repr=False)  # clients must send it (Bearer), when set

    def __post_init__(self) -> None:
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ValueError(f"max_model_len must be >= 1 (None: the tokenizer's), got {self.max_model_len}")
        for name in ("chunk_size", "max_new", "final_max_new", "max_documents", "spool_string_chars"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.spool_bytes < 0:
            raise ValueError(f"spool_bytes must be >= 0, got {self.spool_bytes}")
        if self.max_request_bytes is not None and self.max_request_bytes < 1:
            raise ValueError(f"max_request_bytes must be >= 1 (None: no limit), got {self.max_request_bytes}")
        if self.tokenize_window < 4:
            raise ValueError(f"tokenize_window must be >= 4, got {self.tokenize_window}")
        if self.max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {self.max_queue}")
        if self.question_mode not in QUESTION_MODES:
            raise ValueError(f"question_mode must be one of {', '.join(QUESTION_MODES)}, got {self.question_mode!r}")
        if self.final_prompt not in FINAL_TEMPLATES:
            raise ValueError(f"final_prompt must be one of {', '.join(FINAL_TEMPLATES)}, got {self.final_prompt!r}")


def context_length(settings: ServeSettings, tokenizer: Any) -> int:
    """The model's context in tokens: ``settings.max_model_len``, else the tokenizer's ``model_max_length`` when it
    is a real one, else :data:`DEFAULT_MODEL_LEN`."""
    if settings.max_model_len is not None:
        return settings.max_model_len
    known = getattr(tokenizer, "model_max_length", None)
    if isinstance(known, int) and 0 < known <= KNOWN_MODEL_LEN:
        return known
    return DEFAULT_MODEL_LEN
