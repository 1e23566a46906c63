"""The project's lock files: every dependency set, resolved from ``pyproject.toml`` by ``uv`` with hashes.

Two sets, each for linux x86_64 (manylinux_2_28) and each supported Python (docs/cluster.md, "Dependency sets"):

- ``cpu``: extras ``cpu,dev,data``, without torch. torch is installed first, by pip, as its own command
  (``torch==2.13.0``): which build that is (CPU or CUDA) depends on where pip looks, which a lock resolved from
  package metadata cannot know;
- ``gpu``: extras ``gpu,dev,data``: verl's vLLM stack with the CUDA build of torch. flash-attn is not in it: it
  is a source distribution that builds against the installed torch (``scripts/setup.sh --gpu``).

Resolution reads package metadata only (no wheel is downloaded) and takes seconds.

    python scripts/locks.py                  # write requirements/*.txt
    python scripts/locks.py --check          # exit 1 if a lock is out of sync with pyproject.toml
    python scripts/locks.py --resolve gpu --pyproject COPY/pyproject.toml   # resolve only, print conflicts
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LOCK_DIR = REPO / "requirements"
PYTHONS = ("3.11", "3.12")
PLATFORM = "x86_64-manylinux_2_28"


@dataclass(frozen=True)
class DependencySet:
    name: str
    extras: tuple[str, ...]
    excludes: tuple[str, ...] = ()  # left out of the resolution, with everything only they pull in
    not_emitted: tuple[str, ...] = ()  # resolved (their dependencies are locked) but installed by set-up itself
    agrees_with: str | None = None  # a set resolved first whose versions this one keeps wherever both need a package


# What torch 2.13.0's wheel on the package index requires for CUDA: the CPU build needs none of it.
TORCH_CUDA_RUNTIME = (
    "cuda-bindings",
    "cuda-toolkit",
    "nvidia-cudnn-cu13",
    "nvidia-cusparselt-cu13",
    "nvidia-nccl-cu13",
    "nvidia-nvshmem-cu13",
    "triton",
)

# The GPU set is resolved first: it is the tighter one (vLLM pins many of its dependencies), and the CPU set then
# takes its version of every package both need (torch aside), so the suite runs what a cluster user installs.
SETS = {
    "gpu": DependencySet("gpu", ("gpu", "dev", "data")),
    "cpu": DependencySet(
        "cpu", ("cpu", "dev", "data"), excludes=TORCH_CUDA_RUNTIME, not_emitted=("torch",), agrees_with="gpu"
    ),
}


def lock_path(set_name: str, python: str, lock_dir: Path = LOCK_DIR) -> Path:
    return lock_dir / f"{set_name}-py{python.replace('.', '')}.txt"


def uv_binary() -> str:
    """The ``uv`` next to this interpreter (the dev extra pins it), else the one on PATH."""
    here = Path(sys.executable).parent / "uv"
    found = str(here) if here.exists() else shutil.which("uv")
    if found is None:
        raise SystemExit("uv is not installed: pip install uv (the dev extra pins it)")
    return found


def lock_pins(lock: Path) -> dict[str, str]:
    """``{name: version}`` of a lock file's ``name==version`` lines (names lower case)."""
    pins = {}
    for line in lock.read_text().splitlines():
        if line and not line[0].isspace() and not line.startswith("#") and "==" in line:
            name, version = line.split(" ")[0].split("==")
            pins[name.lower()] = version
    return pins


def agreed_pins(lock: Path, skip: tuple[str, ...]) -> list[str]:
    return [f"{name}=={version}" for name, version in lock_pins(lock).items() if name not in skip]


def compile_lock(
    dependency_set: DependencySet,
    python: str,
    pyproject: Path,
    output: Path,
    hashes: bool = True,
    agree_with: Path | None = None,
) -> subprocess.CompletedProcess:
    """Resolve one set for one Python into ``output``; an existing ``output`` is taken as the preferred versions
    (so re-resolving an unchanged ``pyproject.toml`` reproduces it), ``agree_with`` (a lock) as constraints. Runs
    in ``pyproject``'s folder so the lock's header names relative paths only."""
    command = [uv_binary(), "pip", "compile", pyproject.name, "--quiet", "--no-progress"]
    command += [f"--extra={extra}" for extra in dependency_set.extras]
    command += ["--python-version", python, "--python-platform", PLATFORM, "--no-config"]
    command += ["--custom-compile-command", f"python scripts/locks.py  # {dependency_set.name}, Python {python}"]
    if hashes:
        command.append("--generate-hashes")
    for name in dependency_set.not_emitted:
        command += ["--no-emit-package", name]
    with tempfile.TemporaryDirectory() as tmp:
        if agree_with is not None:
            constraints = Path(tmp) / "constraints.txt"
            constraints.write_text("\n".join(agreed_pins(agree_with, skip=dependency_set.not_emitted)) + "\n")
            command += ["--constraint", str(constraints)]
        if dependency_set.excludes:
            excludes = Path(tmp) / "excludes.txt"
            excludes.write_text("\n".join(dependency_set.excludes) + "\n")
            command += ["--excludes", str(excludes)]
        command += ["-o", str(output.resolve())]
        result = subprocess.run(command, cwd=pyproject.parent, capture_output=True, text=True)
        if agree_with is not None and result.returncode == 0:
            # the annotations name the throw-away constraints file: name the lock it was taken from instead
            output.write_text(output.read_text().replace(str(constraints), f"requirements/{agree_with.name}"))
        return result


def write_all(pyproject: Path, lock_dir: Path) -> int:
    lock_dir.mkdir(exist_ok=True)
    for dependency_set in SETS.values():
        for python in PYTHONS:
            out = lock_path(dependency_set.name, python, lock_dir)
            agree = dependency_set.agrees_with and lock_path(dependency_set.agrees_with, python, lock_dir)
            result = compile_lock(dependency_set, python, pyproject, out, agree_with=agree or None)
            if result.returncode != 0:
                print(f"[locks] {dependency_set.name}, Python {python}: no solution\n{result.stderr}", file=sys.stderr)
                return 1
            print(f"[locks] wrote {out}")
    return 0


def check_all(pyproject: Path, lock_dir: Path) -> int:
    """Re-resolve every set with its committed lock as the preference: an unchanged pyproject reproduces the lock
    to the letter; a changed pin, extra or requirement shows up as a difference. The sets resolve side by side,
    each against the committed lock it agrees with (a stale one of those is reported in its own right)."""

    def check_one(dependency_set: DependencySet, python: str, tmp: Path) -> str | None:
        committed = lock_path(dependency_set.name, python, lock_dir)
        if not committed.exists():
            return f"{committed} is missing"
        fresh = tmp / committed.name
        shutil.copy(committed, fresh)
        agree = dependency_set.agrees_with and lock_path(dependency_set.agrees_with, python, lock_dir)
        result = compile_lock(dependency_set, python, pyproject, fresh, agree_with=agree or None)
        if result.returncode != 0:
            return f"{committed}: pyproject.toml no longer resolves\n{result.stderr}"
        if fresh.read_text() != committed.read_text():
            return f"{committed} is out of sync with pyproject.toml"
        return None

    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(max_workers=4) as pool:
        jobs = [pool.submit(check_one, s, python, Path(tmp)) for s in SETS.values() for python in PYTHONS]
        stale = [problem for job in jobs if (problem := job.result())]
    for line in stale:
        print(f"[locks] {line}", file=sys.stderr)
    if stale:
        print("[locks] run: python scripts/locks.py", file=sys.stderr)
    return 1 if stale else 0


def resolve_only(set_name: str, python: str, pyproject: Path) -> int:
    """Resolve without hashes into a throw-away file: exit 0 if the set resolves, else 1 with uv's explanation."""
    with tempfile.TemporaryDirectory() as tmp:
        result = compile_lock(SETS[set_name], python, pyproject, Path(tmp) / "out.txt", hashes=False)
    if result.returncode != 0:
        print(result.stderr, file=sys.stderr)
    else:
        print(f"[locks] the {set_name} set resolves for Python {python}")
    return 0 if result.returncode == 0 else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 if any lock is out of sync (writes nothing)")
    parser.add_argument("--resolve", choices=sorted(SETS), help="only resolve this set (no hashes, writes nothing)")
    parser.add_argument("--python", default=PYTHONS[0], choices=PYTHONS, help="with --resolve: the Python version")
    parser.add_argument("--pyproject", type=Path, default=REPO / "pyproject.toml", help="the project file to resolve")
    parser.add_argument("--lock-dir", type=Path, default=LOCK_DIR, help="where the lock files are")
    args = parser.parse_args(argv)
    pyproject = args.pyproject.resolve()
    if args.resolve:
        return resolve_only(args.resolve, args.python, pyproject)
    lock_dir = args.lock_dir.resolve()
    return check_all(pyproject, lock_dir) if args.check else write_all(pyproject, lock_dir)


if __name__ == "__main__":
    sys.exit(main())
