"""The dependency sets: the GPU set resolves from package metadata, a conflicting pin is caught, the committed
locks are in sync with pyproject.toml, and the CPU and GPU sets agree wherever both need a package.

The resolution tests ask the package index for metadata (uv, seconds; no wheel is downloaded)."""

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parent.parent
LOCKS = REPO / "scripts" / "locks.py"
sys.path.insert(0, str(LOCKS.parent))
import locks  # noqa: E402  (scripts/ is not a package)


def run_locks(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(LOCKS), *args], capture_output=True, text=True, timeout=300)


def pyproject_with(tmp_path: Path, old: str, new: str) -> Path:
    """A copy of pyproject.toml with one pin changed (the original is never touched)."""
    text = (REPO / "pyproject.toml").read_text()
    assert old in text
    copy = tmp_path / "pyproject.toml"
    copy.write_text(text.replace(old, new))
    return copy


@pytest.mark.parametrize("python", locks.PYTHONS)
def test_gpu_set_resolves_from_metadata(python):
    result = run_locks("--resolve", "gpu", "--python", python)
    assert result.returncode == 0, result.stderr
    assert f"the gpu set resolves for Python {python}" in result.stdout


@pytest.mark.parametrize(
    ("old", "new", "named"),
    [
        # the two pins that kept `make setup-gpu` from installing: vLLM 0.24.0 asks fastapi<0.137 and, through
        # mistral-common, numpy<2.4
        ('"fastapi==0.136.1"', '"fastapi==0.165.0"', "fastapi"),
        ('"numpy==2.3.5"', '"numpy==2.4.6"', "numpy"),
    ],
)
def test_a_conflicting_pin_fails_the_gpu_resolution(tmp_path, old, new, named):
    result = run_locks("--resolve", "gpu", "--pyproject", str(pyproject_with(tmp_path, old, new)))
    assert result.returncode == 1
    assert "No solution found" in result.stderr
    assert named in result.stderr and "vllm" in result.stderr


@pytest.mark.slow(seconds=60)  # with the file's other resolutions
def test_committed_locks_are_in_sync_with_pyproject():
    result = run_locks("--check")
    assert result.returncode == 0, result.stderr


def test_a_changed_pin_makes_the_locks_stale(tmp_path):
    # a dependency dropped: every set still resolves, to locks without it
    pyproject = pyproject_with(tmp_path, '"wonderwords==3.0.1",', "")
    lock_dir = tmp_path / "requirements"
    shutil.copytree(REPO / "requirements", lock_dir)
    result = run_locks("--check", "--pyproject", str(pyproject), "--lock-dir", str(lock_dir))
    assert result.returncode == 1
    for name in ("cpu-py311", "cpu-py312", "gpu-py311", "gpu-py312"):
        assert f"{name}.txt is out of sync" in result.stderr
    assert lock_dir.joinpath("gpu-py311.txt").read_text() == (REPO / "requirements" / "gpu-py311.txt").read_text()


def pins(name: str) -> dict[str, str]:
    return locks.lock_pins(REPO / "requirements" / name)


@pytest.mark.parametrize("python", ["311", "312"])
def test_cpu_and_gpu_sets_agree_on_every_shared_package(python):
    cpu, gpu = pins(f"cpu-py{python}.txt"), pins(f"gpu-py{python}.txt")
    assert len(cpu) > 100 and len(gpu) > len(cpu)  # the parser saw the files
    assert {name: (cpu[name], gpu[name]) for name in cpu.keys() & gpu.keys() if cpu[name] != gpu[name]} == {}
    assert set(cpu) <= set(gpu)  # the CPU set needs nothing the cluster set does not have


@pytest.mark.parametrize("python", ["311", "312"])
def test_cpu_lock_leaves_torch_and_cuda_to_set_up(python):
    cpu = pins(f"cpu-py{python}.txt")
    assert "torch" not in cpu  # installed first by pip: its build depends on where pip looks
    cuda = [name for name in cpu if name.startswith(("nvidia-", "cuda-")) or name == "triton"]
    assert cuda == []
    assert {"sympy", "networkx", "filelock", "jinja2"} <= set(cpu)  # torch's own dependencies are locked
    gpu = pins(f"gpu-py{python}.txt")
    assert gpu["torch"] == "2.11.0" and gpu["vllm"] == "0.24.0" and "flash-attn" not in gpu


@pytest.mark.parametrize("set_name", ["cpu", "gpu"])
def test_every_pin_of_pyproject_is_what_the_locks_hold(set_name):
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = locks.SETS[set_name].extras
    wanted = [Requirement(r) for r in project["dependencies"]]
    wanted += [Requirement(r) for extra in extras for r in project["optional-dependencies"][extra]]
    for python in ("311", "312"):
        held = pins(f"{set_name}-py{python}.txt")
        for requirement in wanted:
            name = requirement.name.lower()
            if name in locks.SETS[set_name].not_emitted:
                continue
            assert name in held, f"{name} is missing from {set_name}-py{python}.txt"
            assert requirement.specifier.contains(held[name]), (name, str(requirement.specifier), held[name])


def test_every_lock_line_carries_a_hash():
    for lock in sorted((REPO / "requirements").glob("*.txt")):
        lines = lock.read_text().splitlines()
        for i, line in enumerate(lines):
            if line and not line[0].isspace() and "==" in line and not line.startswith("#"):
                assert lines[i + 1].strip().startswith("--hash=sha256:"), f"{lock.name}:{i + 1}: {line}"
