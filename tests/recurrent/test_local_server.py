"""Real `transformers serve` processes on free local ports, driven with the `openai` client."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from openai import OpenAI
from transformers import AutoModelForCausalLM, AutoTokenizer

from recurrent.local_server import free_port, transformers_serve


def test_tiny_model_serves_chat(tiny_model_dir):
    with transformers_serve(tiny_model_dir) as server:
        client = OpenAI(base_url=server.base_url, api_key="unused")
        reply = client.chat.completions.create(
            model=server.model, messages=[{"role": "user", "content": "hello"}], max_tokens=5, temperature=0
        )
        assert reply.usage.completion_tokens <= 5
        process = server.process
    assert process.poll() is not None  # stopped on exit


@pytest.mark.slow
def test_smollm2_answers_through_transformers_serve(smollm2_dir):
    with transformers_serve(smollm2_dir) as server:
        client = OpenAI(base_url=server.base_url, api_key="unused")
        reply = client.chat.completions.create(
            model=server.model,
            messages=[{"role": "user", "content": "What is the capital of France?"}],
            max_tokens=20,
            temperature=0,
        )
        assert "Paris" in reply.choices[0].message.content


def greedy_text(model_dir: str, messages: list[dict], dtype: torch.dtype, new_tokens: int) -> str:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True, return_tensors="pt")
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    out = model.generate(prompt["input_ids"], max_new_tokens=new_tokens, do_sample=False)
    return tokenizer.decode(out[0, prompt["input_ids"].shape[1] :], skip_special_tokens=True)


def test_a_checkpoint_whose_config_says_bf16_is_served_in_fp32(tiny_model_dir, tmp_path):
    """verl's export writes "dtype": "bfloat16" into config.json over fp32 weights; `transformers serve` would
    take the config's dtype. Served on CPU, the model computes in fp32, as the CPU twin trained and sampled it: its
    greedy reply is in-process fp32 generation's, which (for this prompt) bf16 generation's is not."""
    export = tmp_path / "export"
    export.mkdir()
    for entry in Path(tiny_model_dir).iterdir():
        if entry.name != "config.json":
            (export / entry.name).symlink_to(entry)
    config = json.loads((Path(tiny_model_dir) / "config.json").read_text())
    (export / "config.json").write_text(json.dumps({**config, "dtype": "bfloat16"}))
    messages = [{"role": "user", "content": "hello there"}]
    fp32 = greedy_text(str(export), messages, torch.float32, 24)
    assert fp32 != greedy_text(str(export), messages, torch.bfloat16, 24)  # the prompt tells the two apart
    with transformers_serve(export) as server:
        client = OpenAI(base_url=server.base_url, api_key="unused")
        reply = client.chat.completions.create(model=server.model, messages=messages, max_tokens=24, temperature=0)
    assert reply.choices[0].message.content == fp32


def test_the_served_model_name_is_the_same_at_every_start(tiny_model_dir, tmp_path):
    """`python -m recurrent.local_server` prints the name requests use; a second start of the same model prints the
    same one, and a request made with it is answered (scripts and the endpoint's --model survive a restart)."""
    import signal

    env = {**os.environ, "TMPDIR": str(tmp_path), "OMP_NUM_THREADS": "1"}
    names = []
    log = tmp_path / "not" / "yet" / "server.log"  # --log in a missing folder: the folder is made
    for start in range(2):
        port = free_port()
        cmd = [sys.executable, "-m", "recurrent.local_server", "--model", str(tiny_model_dir), "--port", str(port)]
        cmd += ["--log", str(log)] if start == 0 else []
        process = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
        try:
            lines = dict(process.stdout.readline().strip().split("=", 1) for _ in range(2))  # URL=..., MODEL=...
            client = OpenAI(base_url=lines["URL"], api_key="unused")
            model = names[0] if names else lines["MODEL"]
            reply = client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=3, temperature=0
            )
            assert reply.choices[0].message.content is not None
            if start == 0:  # n honoured, as in the harness, the endpoint and training (recurrent/local_front.py)
                pair = client.chat.completions.create(
                    model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=3, n=2, temperature=1.0
                )
                assert [choice.index for choice in pair.choices] == [0, 1]
            names.append(lines["MODEL"])
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=60)
    assert names[0] == names[1], names
    assert log.stat().st_size > 0  # the first server's log, in the folder made for it


# ---- python -m recurrent.local_server: a bad option is one line and exit 2, before the server starts ----


def serve_cli(*args: str, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "TMPDIR": str(tmp_path), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "recurrent.local_server", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)


def one_error_line(done: subprocess.CompletedProcess) -> str:
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr[-3000:]
    assert "URL=" not in done.stdout
    return lines[0]


@pytest.mark.timeout(60)
def test_an_unknown_model_is_one_line(tmp_path):
    done = serve_cli("--model", "no-such-model-x", "--port", str(free_port()), tmp_path=tmp_path)
    assert done.returncode == 2
    assert "model 'no-such-model-x' is neither a local folder nor in the local Hugging Face cache" in one_error_line(
        done
    )


FOLDERS = {  # what the folder holds, what the line says it lacks
    "nothing": ((), "no config.json; no weights (*.safetensors or pytorch_model*.bin); no tokenizer ("),
    "a config only": (("config.json",), "holds no model: no weights (*.safetensors or pytorch_model*.bin); no "),
    "no tokenizer": (("config.json", "model.safetensors"), "holds no model: no tokenizer (tokenizer.json, "),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", sorted(FOLDERS))
def test_a_folder_that_holds_no_model_is_named_before_the_server_starts(tiny_model_dir, tmp_path, case):
    names, said = FOLDERS[case]
    folder = tmp_path / "model"
    folder.mkdir()
    for name in names:  # the tiny model's own files: only the missing ones are missing
        (folder / name).write_bytes((Path(tiny_model_dir) / name).read_bytes())
    log = tmp_path / "server.log"
    done = serve_cli("--model", str(folder), "--port", str(free_port()), "--log", str(log), tmp_path=tmp_path)
    assert done.returncode == 2
    line = one_error_line(done)
    assert line.startswith(f"error: --model {folder}: {folder} holds no model: ") and said in line
    assert not log.exists()  # refused before the server (and its log) started


@pytest.mark.timeout(60)
def test_a_port_another_server_answers_on_is_refused(tiny_model_dir, tmp_path):
    """Another server answering /health on the port: without the check its answer passed for ours, its URL was
    printed, and the exit was 0 once our own server (which could not bind) died."""
    from aiohttp import web
    from threaded_http import serve_in_a_thread

    app = web.Application()
    app.router.add_get("/health", lambda request: web.json_response({"status": "ok"}))
    with serve_in_a_thread(app, 10) as url:
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        done = serve_cli("--model", str(tiny_model_dir), "--port", str(port), tmp_path=tmp_path)
    assert done.returncode == 2
    assert (
        one_error_line(done)
        == f"error: --port {port}: 127.0.0.1:{port} is in use by another process; choose another port"
    )


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", ["under a file", "deeper under a file", "a folder", "no permission"])
def test_a_log_that_cannot_be_written_is_one_line(tiny_model_dir, tmp_path, case):
    (tmp_path / "a-file").write_text("")
    (tmp_path / "locked").mkdir(mode=0o500)
    log, said = {
        "under a file": (tmp_path / "a-file" / "server.log", f"{tmp_path / 'a-file'} is a file, not a folder"),
        "deeper under a file": (tmp_path / "a-file" / "x" / "s.log", f"{tmp_path / 'a-file'} is a file, not a folder"),
        "a folder": (tmp_path, "a folder, not a file"),
        "no permission": (tmp_path / "locked" / "server.log", "cannot write it (Permission denied)"),
    }[case]
    if case == "no permission" and os.access(tmp_path / "locked", os.W_OK):
        pytest.skip("run as a user that writes anywhere (root)")
    done = serve_cli("--model", str(tiny_model_dir), "--port", str(free_port()), "--log", str(log), tmp_path=tmp_path)
    assert done.returncode == 2
    assert one_error_line(done) == f"error: --log {log}: {said}"


@pytest.mark.timeout(180)
def test_a_server_that_cannot_load_its_model_is_one_line_and_exit_1(tiny_model_dir, tmp_path):
    """A folder with every file but weights that do not load: the server exits while starting; one line quotes the
    end of its log."""
    folder = tmp_path / "model"
    folder.mkdir()
    for entry in Path(tiny_model_dir).iterdir():
        (folder / entry.name).write_bytes(entry.read_bytes())
    (folder / "model.safetensors").write_bytes(b"not a safetensors file")
    log = tmp_path / "server.log"
    done = serve_cli("--model", str(folder), "--port", str(free_port()), "--log", str(log), tmp_path=tmp_path)
    assert done.returncode == 1
    line = one_error_line(done)
    assert line.startswith("error: transformers serve exited with code 1 before it was ready; its log (")
    assert f"({log}) ends: " in line and "SafetensorError" in line


@pytest.mark.timeout(180)
def test_a_server_that_dies_while_serving_ends_the_command_with_exit_1(tiny_model_dir, tmp_path):
    import signal

    env = {**os.environ, "TMPDIR": str(tmp_path), "OMP_NUM_THREADS": "1"}
    log = tmp_path / "server.log"
    cmd = [sys.executable, "-m", "recurrent.local_server", "--model", str(tiny_model_dir), "--port", str(free_port())]
    process = subprocess.Popen(
        [*cmd, "--log", str(log)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        assert process.stdout.readline().startswith("URL=")  # it answers: then its server is killed
        (child,) = Path(f"/proc/{process.pid}/task/{process.pid}/children").read_text().split()
        os.kill(int(child), signal.SIGKILL)
        _, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 1
    assert err.splitlines()[-1] == f"error: the server exited on its own with code -9; its log: {log}"
