"""The distribution: our packages import next to stock verl, no copy of verl lives here, `recurrent` imports nothing
above it, and the framework below the agents names none of them."""

import ast
import importlib
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_packages_import_with_stock_verl():
    verl = importlib.import_module("verl")
    assert verl.__version__ == "0.9.1"
    assert "site-packages" in verl.__file__  # the installed package, not a vendored copy
    for name in PACKAGES:
        module = importlib.import_module(name)
        assert Path(module.__file__).parent == REPO / name


def test_no_vendored_verl():
    skip = {".venv", ".venv-gpu", ".git", ".cache"}
    vendored = [p for p in REPO.rglob("verl") if p.is_dir() and not skip & set(p.relative_to(REPO).parts)]
    assert vendored == []


PACKAGES = ("recurrent", "recurrent.training", "memagent", "experiments")


def absolute_imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.append(node.module or "")
    return names


def test_recurrent_imports_nothing_above_it():
    # recurrent/ is the framework recurrent/training/, memagent/ and experiments/ build on: it imports none of them,
    # nor verl.
    above = {"verl", "recurrent.training", "memagent", "experiments"}
    offenders = []
    paths = sorted((REPO / "recurrent").rglob("*.py"))
    assert REPO / "recurrent" / "agents" / "memory.py" in paths  # the walk sees the package
    for path in paths:
        names = absolute_imports(path)
        offenders += [f"{path.relative_to(REPO)}: {name}" for name in names if name.split(".")[0] in above]
    assert offenders == []


def test_the_framework_names_no_agent():
    # Below the agents, nothing imports one: the framework of recurrent/ (its agents/ aside) and recurrent/training/
    # reach
    # agents by name, through the registry (recurrent.interface.load_register).
    framework = [p for p in (REPO / "recurrent").rglob("*.py") if "agents" not in p.relative_to(REPO).parts]
    framework += list((REPO / "recurrent.training").rglob("*.py"))
    framework = [p for p in framework if p.relative_to(REPO).parts[:2] != ("recurrent", "serve")]
    offenders = [
        f"{path.relative_to(REPO)}: {name}"
        for path in sorted(framework)
        for name in absolute_imports(path)
        if name.startswith("recurrent.agents")
    ]
    assert offenders == []
    # The endpoint's document path is the memory agent's (docs/serving.md); every other agent it reaches by name.
    serve = [name for path in (REPO / "recurrent" / "serve").rglob("*.py") for name in absolute_imports(path)]
    assert {name for name in serve if name.startswith("recurrent.agents")} == {"memagent.agent"}


SKIP = {".venv", ".venv-gpu", ".cache", ".git", "tests"}


def module_name(path: Path, repo: Path) -> str:
    parts = list(path.relative_to(repo).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, repo: Path) -> set[str]:
    """Every module an import statement of ``path`` names (``from a.b import c`` names ``a.b`` and ``a.b.c``)."""
    package = module_name(path, repo).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


def unreached_modules(repo: Path) -> list[str]:
    """Modules of our packages that no non-test code imports and nothing starts by name (``python -m x.y``,
    ``pkg://x.y``, a class path ``x.y.Class`` in a config or string): in code, scripts, configs or documents."""
    files = [p for p in repo.rglob("*") if p.is_file() and not SKIP & set(p.relative_to(repo).parts)]
    modules = [
        module_name(p, repo) for name in PACKAGES for p in (repo / name).rglob("*.py") if p.name != "__init__.py"
    ]
    imported = set().union(set(), *(imported_modules(p, repo) for p in files if p.suffix == ".py"))
    suffixes = {".py", ".sh", ".yaml", ".md", ".toml", ""}
    text = "\n".join(p.read_text(errors="ignore") for p in files if p.suffix in suffixes)
    return [
        name
        for name in sorted(modules)
        if name not in imported
        and name.rsplit(".", 1)[-1] != "__main__"
        and not any(f"{name}{end}" in text for end in ("\n", " ", "`", '"', "'", ":", "."))
    ]


def test_no_module_is_reachable_only_from_tests():
    assert unreached_modules(REPO) == []


def test_the_reachability_check_finds_a_test_only_module(tmp_path):
    for name, text in {
        "recurrent/__init__.py": "",
        "recurrent/used.py": "",
        "recurrent/started.py": "",
        "recurrent/relative.py": "",
        "recurrent/only_tested.py": "",
        "recurrent/user.py": "from recurrent import used\nfrom .relative import thing\n",
        "scripts/run.sh": "python -m recurrent.started --help\n",
        "tests/test_it.py": "from recurrent import only_tested\n",
    }.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert unreached_modules(tmp_path) == ["recurrent.only_tested", "recurrent.user"]


def test_the_training_walkthrough_reads_in_six_files():
    # docs/architecture.md follows one training sample through the project in bold-named files; asides are
    # italic. A newcomer should need at most six files, and each must exist.
    text = (REPO / "docs" / "architecture.md").read_text()
    section = text.split("## One training sample, in run order")[1].split("\n## ")[0]
    files = set(re.findall(r"\*\*`([^`]+\.py)`\*\*", section))
    assert 4 <= len(files) <= 6, files
    assert all((REPO / name).is_file() for name in files), files
