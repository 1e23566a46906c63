"""Serving: the `vllm serve` command line (vLLM cannot run here), readiness polling and process-group stops
against real local servers (the instant server, and a stand-in `vllm` executable that runs it)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from openai import OpenAI
from process_helpers import SCRIPTS, pid_alive

from recurrent.local_server import free_port
from taskutils.memory_eval.config import ModelEntry
from taskutils.memory_eval.model_servers import (
    choose_backend,
    endpoint,
    replicas_for,
    served_models,
    vllm_command,
    wait_ready,
)

INSTANT_SERVER = SCRIPTS / "instant_server.py"


def test_vllm_command_line():
    cmd = vllm_command(
        "/m/RL-MemoryAgent-14B",
        "BytedTsinghua-SIA/RL-MemoryAgent-14B",
        8123,
        tp=2,
        replicas=4,
        max_model_len=131072,
        extra_args=["--hf-overrides", "{}"],
        vllm_bin="vllm",
    )
    assert cmd == [
        "vllm",
        "serve",
        "/m/RL-MemoryAgent-14B",
        "--served-model-name",
        "BytedTsinghua-SIA/RL-MemoryAgent-14B",
        "--host",
        "127.0.0.1",
        "--port",
        "8123",
        "--tensor-parallel-size",
        "2",
        "--data-parallel-size",
        "4",
        "--max-model-len",
        "131072",
        "--hf-overrides",
        "{}",
    ]
    single = vllm_command("m", "m", 1, vllm_bin="vllm")
    assert "--data-parallel-size" not in single and "--max-model-len" not in single
    assert replicas_for(tp=2, gpus=8) == 4 and replicas_for(tp=4, gpus=2) == 1 and replicas_for(2, 8, 3) == 3
    with pytest.raises(ValueError):
        replicas_for(2, 8, 5)


def test_backend_choice():
    entry = ModelEntry(name="x", checkpoint="x")
    assert choose_backend(entry, gpus=0) == "transformers"
    assert choose_backend(ModelEntry(name="x", checkpoint="x", serve="vllm"), gpus=0) == "vllm"  # the table wins
    assert choose_backend(entry, "vllm", gpus=0) == "vllm"  # the flag wins over both


@pytest.fixture
def instant(tmp_path):
    """The instant server as a subprocess on a free port, serving model 'm'."""
    port = free_port()
    log = tmp_path / "instant.log"
    with log.open("w") as f:
        cmd = [
            sys.executable,
            str(INSTANT_SERVER),
            "--port",
            str(port),
            "--served-model-name",
            "m",
        ]
        process = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    yield process, f"http://127.0.0.1:{port}/v1", log
    process.kill()
    process.wait()


def test_wait_ready_polls_until_the_model_is_listed(instant):
    process, url, log = instant
    waited = wait_ready(url, "m", process, timeout=30, interval=0.1, log_path=log)
    assert waited < 30 and served_models(url) == ["m"]
    with pytest.raises(TimeoutError, match=r"'other' not served .* lists \['m'\]"):
        wait_ready(url, "other", process, timeout=0.5, interval=0.1, log_path=log)


def test_wait_ready_reports_a_server_that_died(tmp_path):
    log = tmp_path / "dead.log"
    log.write_text("CUDA out of memory\n")
    process = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(3)"])
    process.wait()
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="(?s)exited with code 3.*CUDA out of memory"):
        wait_ready(f"http://127.0.0.1:{free_port()}/v1", "m", process, timeout=60, interval=0.1, log_path=log)
    assert time.monotonic() - start < 5


@pytest.fixture
def fake_vllm(tmp_path):
    """A `vllm` executable that records its command line and runs the instant server (vLLM needs GPUs)."""
    argv_file = tmp_path / "argv.json"
    script = tmp_path / "vllm"
    script.write_text(
        f"#!{sys.executable}\n"
        "import json, sys\n"
        f"json.dump(sys.argv[1:], open({str(argv_file)!r}, 'w'))\n"
        "import runpy\n"
        f"sys.argv = [{str(INSTANT_SERVER)!r}, *sys.argv[1:]]\n"
        f"runpy.run_path({str(INSTANT_SERVER)!r}, run_name='__main__')\n"
    )
    script.chmod(0o755)
    return script, argv_file


def test_started_server_is_used_then_stopped_even_on_error(fake_vllm, tiny_model_dir, tmp_path):
    script, argv_file = fake_vllm
    entry = ModelEntry(name="tiny-gpu", checkpoint="tiny", tp=1, serve="vllm", max_model_len=4096)
    started = endpoint(entry, log_dir=tmp_path, vllm_bin=str(script), poll_interval=0.1, ready_timeout=60)
    with pytest.raises(KeyError, match="boom"), started as ep:
        assert ep.kind == "vllm" and ep.model == "tiny" and pid_alive(ep.pid)
        reply = OpenAI(base_url=ep.base_url, api_key="x").chat.completions.create(
            model=ep.model, messages=[{"role": "user", "content": "hi"}], max_tokens=3
        )
        assert reply.choices[0].message.content == "Therefore, the answer is 42."
        pid = ep.pid
        raise KeyError("boom")
    assert not pid_alive(pid)
    argv = json.loads(argv_file.read_text())
    assert argv[:2] == ["serve", tiny_model_dir]  # the local folder: vLLM never downloads
    assert argv[argv.index("--served-model-name") + 1] == "tiny" and "--max-model-len" in argv


def test_url_is_used_as_is():
    entry = ModelEntry(name="x", checkpoint="org/x", served_name="served-x")
    with endpoint(entry, url="http://example.invalid/v1") as ep:
        assert (ep.base_url, ep.model, ep.kind, ep.pid) == ("http://example.invalid/v1", "served-x", "url", None)


def test_vllm_on_a_machine_without_a_gpu_runs_its_sampler_eagerly(monkeypatch):
    """docs/cluster.md, "vLLM on CPU": its torch.compile'd sampling kernel crashed engines on CPU."""
    from taskutils.memory_eval.model_servers import vllm_cpu_env

    monkeypatch.delenv("TORCHDYNAMO_DISABLE", raising=False)
    assert vllm_cpu_env(gpus=0) == {"TORCHDYNAMO_DISABLE": "1"}
    assert vllm_cpu_env(gpus=8) == {}  # a GPU node: vLLM as it is
    monkeypatch.setenv("TORCHDYNAMO_DISABLE", "0")
    assert vllm_cpu_env(gpus=0) == {}  # the caller's own choice stands
