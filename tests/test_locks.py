"""The dependency sets: the GPU set resolves from package metadata, a conflicting pin is caught, the committed
locks are in sync with pyproject.toml, and the CPU and GPU sets agree wherever both need a package.

The resolution tests ask the package index for metadata (uv; no wheel is downloaded). Each resolution is mostly
waiting on the index (about 2 s of CPU in 7 to 30 s), so the ones the selected tests need start side by side, in
their own processes, when the first of them is needed; each test then reads its own."""

import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parent.parent
LOCKS = REPO / "scripts" / "locks.py"
sys.path.insert(0, str(LOCKS.parent))
import locks  # noqa: E402  (scripts/ is not a package)

LOCK_SETS = ("cpu-py311", "cpu-py312", "gpu-py311", "gpu-py312")

# Each resolution the tests read: scripts/locks.py's arguments and, where it resolves a copy of pyproject.toml with
# one pin changed, (old, new). "--lock-dir" stands for a copy of requirements/ made for that resolution alone.
RESOLUTIONS: dict[str, tuple[tuple[str, ...], tuple[str, str] | None]] = {
    **{f"gpu-{python}": (("--resolve", "gpu", "--python", python), None) for python in locks.PYTHONS},
    # the two pins that kept `make setup-gpu` from installing: vLLM 0.24.0 asks fastapi<0.137 and, through
    # mistral-common, numpy<2.4
    "fastapi": (("--resolve", "gpu"), ('"fastapi==0.136.1"', '"fastapi==0.165.0"')),
    "numpy": (("--resolve", "gpu"), ('"numpy==2.3.5"', '"numpy==2.4.6"')),
    "in-sync": (("--check",), None),
    # a dependency dropped: every set still resolves, to locks without it
    "stale": (("--check", "--lock-dir"), ('"wonderwords==3.0.1",', "")),
}


def pyproject_with(folder: Path, old: str, new: str) -> Path:
    """A copy of pyproject.toml with one pin changed (the original is never touched)."""
    text = (REPO / "pyproject.toml").read_text()
    assert old in text
    copy = folder / "pyproject.toml"
    copy.write_text(text.replace(old, new))
    return copy


class Resolutions:
    """The resolutions the selected tests of this module read, started together; ``result`` waits for one."""

    def __init__(self, names: set[str], root: Path) -> None:
        self.folders: dict[str, Path] = {}
        self.running: dict[str, subprocess.Popen] = {}
        self.done: dict[str, subprocess.CompletedProcess] = {}
        for name in sorted(names):
            args, change = RESOLUTIONS[name]
            folder = self.folders[name] = root / name
            folder.mkdir()
            command = [sys.executable, str(LOCKS), *args]
            if "--lock-dir" in args:
                shutil.copytree(REPO / "requirements", folder / "requirements")
                command.append(str(folder / "requirements"))
            if change is not None:
                command += ["--pyproject", str(pyproject_with(folder, *change))]
            self.running[name] = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def result(self, name: str) -> subprocess.CompletedProcess:
        if name not in self.done:
            process = self.running.pop(name)
            stdout, stderr = process.communicate(timeout=300)
            self.done[name] = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
        return self.done[name]

    def stop(self) -> None:
        for process in self.running.values():  # a test that failed before reading its own
            process.kill()
            process.wait()


@pytest.fixture(scope="module")
def resolutions(request, tmp_path_factory) -> Iterator[Resolutions]:
    names = set()  # what the selected tests of this module read: nothing more is started
    for item in request.session.items:
        callspec = getattr(item, "callspec", None)
        if getattr(item, "module", None) is request.module and callspec is not None and "resolution" in callspec.params:
            names.add(callspec.params["resolution"])
    started = Resolutions(names, tmp_path_factory.mktemp("resolutions"))
    yield started
    started.stop()


@pytest.mark.parametrize("resolution", [f"gpu-{python}" for python in locks.PYTHONS])
def test_gpu_set_resolves_from_metadata(resolution, resolutions):
    result = resolutions.result(resolution)
    assert result.returncode == 0, result.stderr
    python = resolution.removeprefix("gpu-")
    assert f"the gpu set resolves for Python {python}" in result.stdout


@pytest.mark.parametrize(("resolution", "named"), [("fastapi", "fastapi"), ("numpy", "numpy")])
def test_a_conflicting_pin_fails_the_gpu_resolution(resolution, named, resolutions):
    result = resolutions.result(resolution)
    assert result.returncode == 1
    assert "No solution found" in result.stderr
    assert named in result.stderr and "vllm" in result.stderr


@pytest.mark.slow(seconds=50)  # every resolution of the file, side by side (58-63 s at load 3.5-7)
@pytest.mark.parametrize("resolution", ["in-sync"])
def test_committed_locks_are_in_sync_with_pyproject(resolution, resolutions):
    result = resolutions.result(resolution)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("resolution", ["stale"])
def test_a_changed_pin_makes_the_locks_stale(resolution, resolutions):
    result = resolutions.result(resolution)
    assert result.returncode == 1
    for name in LOCK_SETS:
        assert f"{name}.txt is out of sync" in result.stderr
    lock_dir = resolutions.folders[resolution] / "requirements"
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
