"""Where a chat request holds the document and where the question: the server's question modes.

An OpenAI request is a list of messages; the memory agent needs a (document, question) pair. Each mode is one
rule, chosen per server (``--question-mode``) or per request (``memagent.question_mode``), and each answers a
request where it finds no question with a :class:`QuestionError` saying what it looked for (HTTP 400):

- ``field``: the document in the request's ``memagent.document``, the question in ``memagent.question`` or
  else the last user message (a harness that has the two apart sends them apart);
- ``messages``: the document in the user messages before the last one (joined by a blank line), the question in
  the last user message (a chat UI: paste the document, then ask);
- ``split``: one message cut in two by a rule: after the last occurrence of a marker string
  (``--split-marker``, ``memagent.split_marker``; the marker belongs to neither part), or, without a marker,
  after the last blank line (the RULER and LongBench/HotpotQA prompts end with their question after a blank
  line). The user messages are joined by a blank line first, so one message is the usual case;
- ``auto`` (the default): ``field`` when the request has ``memagent.document``, else ``messages`` when it has
  several user messages, else ``split``.

System, developer and assistant messages are not read: the agent's prompts are fixed (docs/serving.md).

A text may be a :class:`taskutils.endpoint.spool.LongText` (a long request held on disk): the rules are the same, the
document found stays on disk and the question is read.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass

from taskutils.endpoint.spool import LongText, as_str, join_texts

Text = str | LongText

QUESTION_MODES = ("auto", "field", "messages", "split")
BLANK_LINE = re.compile(r"\n[ \t]*\n")


class QuestionError(ValueError):
    """The request has no question where its mode looks for one (or no document where the mode needs it);
    ``param`` names the request field to blame (a 400's ``param``)."""

    def __init__(self, message: str, param: str = "messages") -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class Found:
    document: Text
    question: str
    mode: str  # the rule that found them (auto resolves to one of the others)


def find_question(
    user_texts: list[Text],
    mode: str,
    split_marker: str | None = None,
    field_document: Text | None = None,
    field_question: Text | None = None,
) -> Found:
    """The document and the question of a request whose user messages have the texts ``user_texts`` (in order),
    by the rule ``mode`` (one of :data:`QUESTION_MODES`)."""
    if mode == "auto":
        if field_document is not None:
            mode = "field"
        elif len(user_texts) > 1:
            mode = "messages"
        else:
            mode = "split"
    if mode == "field":
        return _by_field(user_texts, field_document, field_question)
    if mode == "messages":
        return _by_messages(user_texts)
    if mode == "split":
        return _by_split(user_texts, split_marker)
    raise QuestionError(f"unknown question mode {mode!r}; choose one of {', '.join(QUESTION_MODES)}")


def _by_field(user_texts: list[Text], document: Text | None, question: Text | None) -> Found:
    if document is None:
        raise QuestionError(
            "question mode 'field' reads the document from the request field memagent.document, which is missing",
            "memagent.document",
        )
    param = "memagent.question"
    if question is None:
        param = "messages"
        if not user_texts:
            raise QuestionError(
                "found no question: question mode 'field' reads it from memagent.question or else the last user "
                "message, and the request has neither"
            )
        question = user_texts[-1]
    question = as_str(question)
    if not question.strip():
        raise QuestionError(f"found no question: the question is empty (question mode 'field', {param})", param)
    return Found(document, question, "field")


def _by_messages(user_texts: list[Text]) -> Found:
    if not user_texts:
        raise QuestionError(
            "found no question: question mode 'messages' reads it from the last user message, and "
            "the request has no user message"
        )
    if len(user_texts) < 2:
        raise QuestionError(
            "found no document: question mode 'messages' reads the document from the user messages before the "
            "last one (the question), and the request has one user message; send the document and the question "
            "as two user messages, or use question mode 'split' or 'field'"
        )
    question = as_str(user_texts[-1])
    if not question.strip():
        raise QuestionError("found no question: the last user message is empty (question mode 'messages')")
    return Found(join_texts("\n\n", user_texts[:-1]), question, "messages")


def _by_split(user_texts: list[Text], marker: str | None) -> Found:
    if not user_texts:
        raise QuestionError("found no question: question mode 'split' reads the user message, and there is none")
    text = join_texts("\n\n", user_texts)
    if marker:
        document, found, question = text.rpartition(marker)
        if not found:
            raise QuestionError(
                f"found no question: question mode 'split' takes the text after the last {marker!r} (the split "
                "marker), and the message does not contain it"
            )
    else:
        cut = _last_blank_line(text)
        if cut is None:
            raise QuestionError(
                "found no question: question mode 'split' without a marker takes the text after the last blank line "
                "as the question, and the message has no blank line (set memagent.split_marker, or use question "
                "mode 'field' or 'messages')"
            )
        start, stop, end = cut
        document = text[:start] if isinstance(text, str) else text.view(0, start)
        question = text[stop:end]
    if not question.strip():
        raise QuestionError("found no question: the text after the split is empty (question mode 'split')")
    return Found(document, question, "split")


def _last_blank_line(text: Text) -> tuple[int, int, int] | None:
    """(start, end) of the last blank line of ``text.rstrip()`` and where that ends; None without one."""
    if isinstance(text, LongText):
        end = text.rstrip_end()
        found = text.last_match(BLANK_LINE, end)
        return None if found is None else (*found, end)
    # Offsets, not copies: rstrip() and a list of every blank line would each hold a long document again.
    end = len(text)
    while end and text[end - 1].isspace():  # str.isspace is what rstrip() strips
        end -= 1
    last = deque(BLANK_LINE.finditer(text, 0, end), maxlen=1)  # the last blank line, none kept before it
    return None if not last else (last[0].start(), last[0].end(), end)
