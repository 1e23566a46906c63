"""The OpenAI chat-completions wire format as the MemAgent server reads and answers it: a request checked field
by field (HTTP 400 naming the field, 404 for another model), the ``memagent`` extension object, errors in
OpenAI's shape, and the HTTP status an upstream failure becomes (docs/serving.md, "Errors")."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import openai
from fastapi.responses import JSONResponse

from recurrent.client import ChatRequestError
from recurrent.sampling import SamplingError, check_stop, check_value
from taskutils.endpoint.questions import QUESTION_MODES, Text
from taskutils.endpoint.spool import LongText, join_texts

# Sampling fields of a request that go to every turn upstream, as the request gives them (vLLM reads all of
# them), each checked first by its rule in recurrent.sampling: a value out of range is the client's 400 here, not
# an upstream failure after retries.
SAMPLING_FIELDS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
)
# OpenAI fields that would change what an answer is and that an agent's own calls cannot honour: refused (400), not
# silently dropped. Other unknown fields (user, metadata, store, ...) are ignored, as OpenAI-compatible servers do.
UNSUPPORTED = {
    "tools": "tool calls",
    "functions": "function calls",
    "audio": "audio output",
    "prediction": "predicted outputs",
}
# The object fields where a request holds texts that may be long (a message's content, a text part's text, the
# extension's document and question): in a long request they may stay on disk (taskutils.endpoint.spool).
LONG_TEXT_FIELDS = frozenset({"content", "text", "document", "question"})
# The roles of OpenAI's chat messages; any other is the client's 400 (it would reach an agent or an upstream that
# cannot read it).
ROLES = ("system", "developer", "user", "assistant", "tool", "function")
EXTENSION_FIELDS = (
    "question_mode",
    "split_marker",
    "document",
    "question",
    "return_memories",
    "passthrough",
    "progress",
)


class ApiError(Exception):
    """An HTTP error answered in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(
        self, status: int, message: str, kind: str = "invalid_request_error", code: str | None = None, param=None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.code = code
        self.param = param

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status)


@dataclass
class Extension:
    """The request's ``memagent`` object (all optional)."""

    question_mode: str | None = None
    split_marker: str | None = None
    document: Text | None = None  # a LongText when the request was long (taskutils.endpoint.spool)
    question: Text | None = None
    return_memories: bool = False
    passthrough: bool | None = None
    progress: bool = False  # a stream reports each model call as a data chunk, not a comment (docs/serving.md)


@dataclass
class ChatRequest:
    messages: list[dict[str, Text]]  # role and text content (a LongText when long), in order
    stream: bool = False
    include_usage: bool = False
    max_tokens: int | None = None
    stop: list[str] = field(default_factory=list)
    sampling: dict[str, Any] = field(default_factory=dict)
    ext: Extension = field(default_factory=Extension)

    @property
    def user_texts(self) -> list[Text]:
        return [m["content"] for m in self.messages if m["role"] == "user"]

    def drop_texts(self) -> None:
        """Forget the messages and the document field once the document and the question are found: a long
        document is then held only where the service put it."""
        self.messages = []
        self.ext.document = None


def bad_request(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param=param)


# A lone surrogate: what a JSON "\ud800" escape without its pair decodes to. Python holds it, but it is no Unicode
# text: the tokenizer refuses it (a 500 after the document was queued) and no upstream could be sent it.
_SURROGATE = re.compile("[\ud800-\udfff]")


def _unicode_text(text: Text, param: str) -> Text:
    """``text`` when it is Unicode text; a 400 naming ``param`` where it holds a lone surrogate (a text kept on disk
    is read block by block)."""
    blocks = [(0, text)] if isinstance(text, str) else text.blocks()
    for at, block in blocks:
        found = _SURROGATE.search(block)
        if found:
            raise bad_request(
                f"{param} holds a lone surrogate (U+{ord(found.group()):04X}, half of a UTF-16 pair) at character "
                f"{at + found.start()}: it is not Unicode text",
                param,
            )
    return text


def _text_content(content: Any, where: str) -> Text:
    """A message's content as text: a string, or a list of text parts (joined by newlines, as vLLM does)."""
    if content is None:
        return ""
    if isinstance(content, (str, LongText)):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if (
                not isinstance(part, dict)
                or part.get("type") != "text"
                or not isinstance(part.get("text"), (str, LongText))
            ):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise bad_request(f"{where}.content: only text parts are read, got a {kind!r} part", f"{where}.content")
            texts.append(part["text"])
        return join_texts("\n", texts)
    raise bad_request(f"{where}.content must be a string or a list of text parts", f"{where}.content")


def _sampling_value(body: dict, name: str, rule: str | None = None) -> Any:
    """``body[name]`` checked by the sampling rule ``rule`` (default ``name``); None when absent."""
    value = body.get(name)
    if value is None:
        return None
    try:
        return check_value(rule or name, value, name)
    except SamplingError as err:
        raise bad_request(str(err), name) from None


def parse_request(body: Any, served_model: str, max_model_len: int | None = None) -> ChatRequest:
    """A chat-completions body checked field by field; :class:`ApiError` (400, 404 for another model) otherwise.
    ``max_model_len``: the model's context; a ``max_tokens`` over it is 400, as vLLM answers it."""
    if not isinstance(body, dict):
        raise bad_request(f"the request body must be a JSON object, got {type(body).__name__}")
    model = body.get("model")
    if model is not None and model != served_model:
        raise ApiError(
            404,
            f"model {model!r} is not served here; this server serves {served_model!r} (GET /v1/models)",
            code="model_not_found",
            param="model",
        )
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise bad_request("messages must be a list of {role, content} objects", "messages")
    parsed = []
    for k, message in enumerate(messages):
        where = f"messages[{k}]"
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise bad_request(f"{where} must be an object with a string role", where)
        if message["role"] not in ROLES:
            role = ascii(message["role"])[:40]
            raise bad_request(f"{where}.role must be one of {', '.join(ROLES)}, got {role}", f"{where}.role")
        content = _unicode_text(_text_content(message.get("content"), where), f"{where}.content")
        parsed.append({"role": message["role"], "content": content})
    for name, what in UNSUPPORTED.items():
        if body.get(name):
            raise bad_request(f"{name}: {what} are not supported: the agent makes its own model calls", name)
    if body.get("tool_choice") not in (None, "none"):
        raise bad_request(
            "tool_choice: tool calls are not supported: the agent makes its own model calls", "tool_choice"
        )
    if body.get("logprobs") or body.get("top_logprobs"):
        raise bad_request("logprobs are not supported: the answer is the last of several model calls", "logprobs")
    fmt = body.get("response_format")
    if fmt is not None and (not isinstance(fmt, dict) or fmt.get("type") != "text"):
        raise bad_request("response_format: only {'type': 'text'} is supported", "response_format")
    if _sampling_value(body, "n") not in (None, 1):
        raise bad_request(f"n must be 1 (one answer per document), got {body.get('n')!r}", "n")
    stream = body.get("stream", False)
    if not isinstance(stream, bool) and stream is not None:
        raise bad_request(f"stream must be true or false, got {stream!r}", "stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise bad_request("stream_options must be an object", "stream_options")
    max_tokens = None
    for name in ("max_completion_tokens", "max_tokens"):
        value = _sampling_value(body, name, "max_tokens")
        if value is not None:
            if max_model_len is not None and value > max_model_len:
                raise bad_request(
                    f"{name} is {value}, over this model's maximum context length of {max_model_len} tokens; "
                    f"ask for at most {max_model_len}",
                    name,
                )
            max_tokens = value
    try:
        stop = check_stop(body.get("stop"))
    except SamplingError as err:
        raise bad_request(str(err), "stop") from None
    for k, text in enumerate(stop):
        _unicode_text(text, f"stop[{k}]")
    sampling = {}
    for name in SAMPLING_FIELDS:
        value = _sampling_value(body, name)
        if value is not None:
            sampling[name] = value
    return ChatRequest(
        messages=parsed,
        stream=bool(stream),
        include_usage=bool(options.get("include_usage")),
        max_tokens=max_tokens,
        stop=[s for s in stop if s],
        sampling=sampling,
        ext=_extension(body.get("memagent")),
    )


def _extension(raw: Any) -> Extension:
    if raw is None:
        return Extension()
    if not isinstance(raw, dict):
        raise bad_request("memagent must be an object", "memagent")
    unknown = sorted(set(raw) - set(EXTENSION_FIELDS))
    if unknown:
        raise bad_request(f"memagent: unknown field(s) {unknown}; known: {', '.join(EXTENSION_FIELDS)}", "memagent")
    ext = Extension(**raw)
    for name in ("question_mode", "split_marker", "document", "question"):
        value = getattr(ext, name)
        if value is not None and not isinstance(value, (str, LongText) if name in ("document", "question") else str):
            raise bad_request(f"memagent.{name} must be a string", f"memagent.{name}")
        if value is not None:
            _unicode_text(value, f"memagent.{name}")
    for name in ("return_memories", "passthrough", "progress"):
        value = getattr(ext, name)
        if value is not None and not isinstance(value, bool):
            raise bad_request(f"memagent.{name} must be true or false", f"memagent.{name}")
    if ext.question_mode is not None and ext.question_mode not in QUESTION_MODES:
        raise bad_request(
            f"memagent.question_mode must be one of {', '.join(QUESTION_MODES)}, got {ext.question_mode!r}",
            "memagent.question_mode",
        )
    ext.return_memories = bool(ext.return_memories)
    ext.progress = bool(ext.progress)
    return ext


# ---------------------------------------------------------------------------------------------------------------
# upstream failures
# ---------------------------------------------------------------------------------------------------------------


def upstream_error(err: ChatRequestError, where: str) -> ApiError:
    """The HTTP status a failed upstream call answers with, its message quoting the upstream (which names its
    URL): unreachable 502, too slow 504, its own 5xx 502, rate-limited 429, a refused key or an unknown model 502
    (this server's configuration, not the client's request), any other 4xx as it is (the request's fault:
    unsupported sampling parameter, a prompt over its context length)."""
    cause = err.__cause__
    status = err.status_code
    if status is None:
        if isinstance(cause, (TimeoutError, openai.APITimeoutError)):
            return ApiError(504, f"{where}: {err}", "upstream_error", "upstream_timeout")
        if isinstance(cause, openai.APIConnectionError):
            return ApiError(502, f"{where}: {err}", "upstream_error", "upstream_unreachable")
        return ApiError(502, f"{where}: {err}", "upstream_error", "upstream_bad_response")
    if status == 429:
        return ApiError(429, f"{where}: {err}", "upstream_error", "upstream_rate_limited")
    if status == 408:
        return ApiError(504, f"{where}: {err}", "upstream_error", "upstream_timeout")
    if status >= 500 or status in (401, 403, 404):
        return ApiError(502, f"{where}: {err}", "upstream_error", f"upstream_{status}")
    return ApiError(status, f"{where}: {err}", "invalid_request_error", f"upstream_{status}")
