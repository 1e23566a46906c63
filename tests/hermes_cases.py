"""Hand-written replies in the Qwen family's tool-call format, with what vLLM 0.24.0's ``hermes`` tool parser makes of
each (content, then (name, arguments) per call; None: no calls). The outputs were read off the parser's code
(vllm/tool_parsers/hermes_tool_parser.py and the DelegatingParser of vllm/parser/abstract_parser.py) and are
checked against the parser itself by tests/gpu_stack/test_hermes_parity.py with the GPU set's interpreter."""

CALL = '{"name": "calculate", "arguments": {"expression": "6 * 7"}}'
CASES: dict[str, tuple[str, str | None, list[tuple[str, str]] | None]] = {
    "well_formed": (f"<tool_call>{CALL}</tool_call>", None, [("calculate", '{"expression": "6 * 7"}')]),
    "qwen_newlines": (f"<tool_call>\n{CALL}\n</tool_call>", None, [("calculate", '{"expression": "6 * 7"}')]),
    "two_calls": (
        '<tool_call>{"name": "calculate", "arguments": {"expression": "1+2"}}</tool_call>\n'
        '<tool_call>{"name": "lookup", "arguments": {"q": "\u03c0", "n": 3}}</tool_call>',
        None,
        [("calculate", '{"expression": "1+2"}'), ("lookup", '{"q": "\u03c0", "n": 3}')],
    ),
    "malformed_json": (
        '<tool_call>{"name": "calculate", "arguments": {"expression": 6 * 7}}</tool_call>',
        '<tool_call>{"name": "calculate", "arguments": {"expression": 6 * 7}}</tool_call>',
        None,
    ),
    "text_around": (
        f"Let me compute that. <tool_call>{CALL}</tool_call> Then I box it.",
        "Let me compute that. ",
        [("calculate", '{"expression": "6 * 7"}')],
    ),
    "whitespace_before": (
        '  \n<tool_call>{"name": "calculate", "arguments": {}}</tool_call>',
        None,
        [("calculate", "{}")],
    ),
    "unclosed": (f"Sure <tool_call>{CALL}", "Sure ", [("calculate", '{"expression": "6 * 7"}')]),
    "no_call": ("The answer is \\boxed{42}", "The answer is \\boxed{42}", None),
    "missing_arguments": (
        '<tool_call>{"name": "calculate"}</tool_call>',
        '<tool_call>{"name": "calculate"}</tool_call>',
        None,
    ),
    "one_good_one_bad": (
        f"<tool_call>{CALL}</tool_call><tool_call>{{oops}}</tool_call>",
        f"<tool_call>{CALL}</tool_call><tool_call>{{oops}}</tool_call>",
        None,
    ),
    "string_arguments": (
        '<tool_call>{"name": "calculate", "arguments": "6*7"}</tool_call>',
        None,
        [("calculate", '"6*7"')],
    ),
    "not_an_object": ("<tool_call>[1, 2]</tool_call>", "<tool_call>[1, 2]</tool_call>", None),
    "name_not_a_string": (
        '<tool_call>{"name": 5, "arguments": {}}</tool_call>',
        '<tool_call>{"name": 5, "arguments": {}}</tool_call>',
        None,
    ),
    "empty_tag": ("<tool_call></tool_call>", "<tool_call></tool_call>", None),
}
