"""recurrent/tool_calls.py reads a reply as vLLM 0.24.0's ``hermes`` tool parser does: the parser itself (the one
``vllm serve --enable-auto-tool-choice --tool-call-parser hermes`` runs on a finished reply) on every hand-written
reply of tests/hermes_cases.py, against ours and the outputs pinned there."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from transformers import AutoTokenizer
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.parser.parser_manager import ParserManager

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the shared cases
from hermes_cases import CASES  # noqa: E402

from recurrent.models import TINY, materialize  # noqa: E402
from recurrent.tool_calls import parse_tool_calls  # noqa: E402

TOOLS = [{"type": "function", "function": {"name": "calculate", "parameters": {"type": "object", "properties": {}}}}]


@pytest.fixture(scope="module")
def parser_and_request():
    tokenizer = AutoTokenizer.from_pretrained(materialize(TINY))
    parser_cls = ParserManager.get_parser(tool_parser_name="hermes", enable_auto_tools=True)
    request = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "q"}], tools=TOOLS)
    assert request.tool_choice == "auto"  # tools without a tool_choice: vLLM's default
    return lambda: parser_cls(tokenizer, request.tools), request


@pytest.mark.parametrize("name", sorted(CASES))
def test_vllms_hermes_parser_reads_each_reply_as_ours_does(parser_and_request, name):
    make_parser, request = parser_and_request
    text, content, calls = CASES[name]
    _, vllm_content, vllm_calls = make_parser().parse(text, request, enable_auto_tools=True)
    vllm = (vllm_content, None if vllm_calls is None else [(c.name, c.arguments) for c in vllm_calls])
    assert vllm == (content, calls)  # the pinned outputs are vLLM's
    ours = parse_tool_calls(text)
    assert (ours.content, [(c.name, c.arguments) for c in ours.calls] or None) == vllm
