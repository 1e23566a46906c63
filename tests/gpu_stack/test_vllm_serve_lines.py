"""Every ``vllm serve`` line the evaluation harness builds from ``taskutils/memory_eval/models.yaml`` goes through
vLLM 0.24.0's own ``serve`` parser and engine-argument class; for the Qwen2.5-7B/14B/32B-based entries, vLLM's
model configuration built from the published config.json with the line's overrides has the intended maximum
length and rope settings."""

from __future__ import annotations

import json

import pytest
from conftest import BASE_OF
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.entrypoints.cli import serve as vllm_serve_cli
from vllm.utils.argparse_utils import FlexibleArgumentParser

from taskutils.memory_eval.config import load_table
from taskutils.memory_eval.model_servers import vllm_command_for

GPUS_PER_NODE = 8  # the paper's nodes
NATIVE_CONTEXT = 32768  # Qwen2.5's max_position_embeddings
ENTRIES = [entry for entry in load_table() if entry.serve in ("auto", "vllm") and not entry.url]


def parse_serve_line(line: list[str]) -> AsyncEngineArgs:
    """What ``vllm serve ...`` does with its command line, up to the engine arguments: vLLM's CLI parser with its
    ``serve`` subcommand, the subcommand's own validation, then ``AsyncEngineArgs.from_cli_args``."""
    parser = FlexibleArgumentParser(prog="vllm")
    subparsers = parser.add_subparsers(required=False, dest="subparser")
    commands = {}
    for command in vllm_serve_cli.cmd_init():
        command.subparser_init(subparsers).set_defaults(dispatch_function=command.cmd)
        commands[command.name] = command
    args = parser.parse_args(line[1:])  # without the executable
    assert args.subparser == "serve"
    commands["serve"].validate(args)
    args.model = args.model_tag
    return AsyncEngineArgs.from_cli_args(args)


def test_the_table_has_the_papers_vllm_entries():
    names = {entry.name for entry in ENTRIES}
    assert {"MemoryAgent-14B-5k-1k-infty", "MemoryAgent-7B-5k-1k-infty", "Qwen-14B-120k+10k"} <= names
    assert len([entry for entry in ENTRIES if entry.group in ("paper", "ablation")]) == 14
    # and the CPU twin vLLM serves on these machines (tests/taskutils/memory_eval/test_eval_vllm_cpu.py)
    assert [entry.name for entry in ENTRIES if entry.group == "cpu-vllm"] == ["smollm2-135m-instruct-vllm"]


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda entry: entry.name)
def test_vllm_accepts_the_harness_serve_line(entry, model_dirs):
    folder = model_dirs[BASE_OF.get(entry.checkpoint, "Qwen2.5-7B-Instruct")]
    line = vllm_command_for(entry, str(folder), port=8000, gpus=GPUS_PER_NODE)
    engine_args = parse_serve_line(line)
    assert engine_args.model == str(folder)
    assert engine_args.served_model_name == [entry.request_name]
    assert engine_args.tensor_parallel_size == entry.tp
    assert engine_args.data_parallel_size == GPUS_PER_NODE // entry.tp  # the whole node, one endpoint
    assert engine_args.max_model_len == entry.max_model_len
    if entry.checkpoint not in BASE_OF:
        return  # another architecture or a 1M-context config: parsed above, its model config not written here
    model_config = engine_args.create_model_config()
    rope = model_config.hf_config.rope_parameters
    if "--hf-overrides" in entry.vllm_args:
        wanted = json.loads(entry.vllm_args[entry.vllm_args.index("--hf-overrides") + 1])["rope_parameters"]
        assert wanted == {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768,
                          "rope_theta": 1000000.0}  # fmt: skip
        assert {key: rope[key] for key in wanted} == wanted
        assert model_config.max_model_len == 4 * NATIVE_CONTEXT == entry.max_model_len
    else:
        assert rope.get("rope_type", "default") == "default" and rope["rope_theta"] == 1000000.0
        assert model_config.max_model_len == NATIVE_CONTEXT  # the memory agent's ~8K-token turns fit


def test_a_128k_line_without_yarn_is_refused(model_dirs):
    # The check has teeth: the 14B direct baseline's line with its YaRN override dropped asks for 131072 tokens of
    # a 32768-token model, which vLLM's model configuration refuses.
    entry = next(entry for entry in ENTRIES if entry.name == "Qwen-14B-120k+10k")
    line = vllm_command_for(entry, str(model_dirs["Qwen2.5-14B-Instruct"]), port=8000, gpus=GPUS_PER_NODE)
    at = line.index("--hf-overrides")
    engine_args = parse_serve_line(line[:at] + line[at + 2 :])
    with pytest.raises(Exception, match="max_model_len|max_position_embeddings"):
        engine_args.create_model_config()


def test_an_unknown_flag_is_refused(model_dirs):
    entry = ENTRIES[0]
    line = vllm_command_for(entry, str(model_dirs["Qwen2.5-14B-Instruct"]), port=8000, gpus=GPUS_PER_NODE)
    with pytest.raises(SystemExit):
        parse_serve_line([*line, "--tensor-paralel-size", "2"])


def test_the_readmes_serve_line_for_a_merged_checkpoint(model_dirs):
    # README, "From a training checkpoint to the paper's table": the merged folder served by vLLM, as written there
    from readme_blocks import readme_commands

    _, commands = readme_commands("## From a training checkpoint to the paper's table")
    serve = next(argv for argv in commands if argv[:2] == ["vllm", "serve"])
    folder = str(model_dirs["Qwen2.5-7B-Instruct"])  # the merged 7B: its config.json is the base model's
    engine_args = parse_serve_line([serve[0], serve[1], folder, *serve[3:]])
    assert engine_args.tensor_parallel_size * engine_args.data_parallel_size == GPUS_PER_NODE
    assert engine_args.served_model_name == ["memagent"]
    assert engine_args.create_model_config().max_model_len == NATIVE_CONTEXT
