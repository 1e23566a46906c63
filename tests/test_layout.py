"""The distribution and the layout: our packages import next to stock verl, no copy of verl lives here, each place
of docs/architecture.md's table imports only what that table says, and no import circle exists."""

import ast
import importlib
import os
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("recurrent", "verl_ext", "taskutils", "experiments")


def test_packages_import_with_stock_verl():
    verl = importlib.import_module("verl")
    assert verl.__version__ == "0.9.1"
    assert "site-packages" in verl.__file__  # the installed package, not a vendored copy
    for name in PACKAGES:
        module = importlib.import_module(name)
        assert Path(module.__file__).parent == REPO / name


def test_no_vendored_verl():
    skip = {".venv", ".venv-gpu", ".venv-vllm-cpu", ".git", ".cache"}
    vendored = [p for p in REPO.rglob("verl") if p.is_dir() and not skip & set(p.relative_to(REPO).parts)]
    assert vendored == []


SKIP = {".venv", ".venv-gpu", ".venv-vllm-cpu", ".cache", ".git", "tests"}


def project_files(repo: Path) -> list[Path]:
    """Every file under ``repo`` outside the folders of SKIP, at any depth (the venvs alone hold ~200,000 files:
    they are not walked)."""
    found = []
    for folder, subfolders, names in os.walk(repo):
        subfolders[:] = sorted(name for name in subfolders if name not in SKIP)
        found.extend(Path(folder, name) for name in sorted(names))
    return [path for path in found if path.is_file()]


def module_name(path: Path, repo: Path) -> str:
    parts = list(path.relative_to(repo).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, repo: Path) -> set[str]:
    """Every module an import statement of ``path`` names (``from a.b import c`` names ``a.b`` and ``a.b.c``),
    function-level imports included."""
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


# --- the places of docs/architecture.md ---------------------------------------------------------------------------


def place_of(module: str) -> str | None:
    """The place a module of ours belongs to, in the table's words (its folder, dotted), or None for another's."""
    if module == "recurrent.impls" or module.startswith("recurrent.impls."):
        return "recurrent.impls"
    top = module.split(".")[0]
    return top if top in PACKAGES else None


def documented_places(text: str) -> dict[str, set[str]]:
    """docs/architecture.md's place table: folder -> the places of ours it may import."""
    places = {}
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 4 and re.fullmatch(r"`[a-z_/]+/`", cells[1]):
            folder = cells[1].strip("`").rstrip("/").replace("/", ".")
            places[folder] = set(re.findall(r"`([a-z_.]+)`", cells[3]))
    return places


def imports_across_places(repo: Path) -> dict[str, set[str]]:
    """For each place, the other places its files import (function-level imports count)."""
    found: dict[str, set[str]] = {}
    for name in PACKAGES:
        for path in (repo / name).rglob("*.py"):
            here = place_of(module_name(path, repo))
            targets = {place_of(module) for module in imported_modules(path, repo)}
            found.setdefault(here, set()).update(t for t in targets if t is not None and t != here)
    return found


PLACE_CELL_CHARS = 300  # the place table is read at a glance: its files and details are in the section below it


def place_table_cells(text: str) -> list[str]:
    """Every cell of docs/architecture.md's place table, its header included: the table that starts with the row
    ``| place | folder | owns | imports of ours |``, up to its first line that is not a row."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if re.fullmatch(r"\|\s*place\s*\|\s*folder\s*\|.*", line))
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append(line)
    return [cell.strip() for row in rows for cell in row.strip().strip("|").split("|")]


def test_the_place_tables_cells_are_short():
    text = (REPO / "docs" / "architecture.md").read_text()
    cells = place_table_cells(text)
    assert len(cells) == 4 * (2 + 5)  # the header, its rule and the five places
    long = [cell[:60] + "..." for cell in cells if len(cell) > PLACE_CELL_CHARS]
    assert not long, f"cells over {PLACE_CELL_CHARS} characters (move the detail under the table): {long}"
    assert "\n## What each place holds\n" in text


def test_a_long_place_cell_is_found():
    owns = "x" * (PLACE_CELL_CHARS + 1)
    table = f"| place | folder | owns | imports of ours |\n|---|---|---|---|\n| core | `a/` | {owns} | none |"
    text = f"intro\n\n{table}\n\nmore"
    assert [len(cell) for cell in place_table_cells(text)] == [5, 6, 4, 15, 3, 3, 3, 3, 4, 4, PLACE_CELL_CHARS + 1, 4]


def test_each_place_imports_only_what_the_architecture_says():
    places = documented_places((REPO / "docs" / "architecture.md").read_text())
    assert set(places) == {"recurrent", "recurrent.impls", "verl_ext", "taskutils", "experiments"}
    found = imports_across_places(REPO)
    assert set(found) == set(places)
    wrong = {place: sorted(found[place] - allowed) for place, allowed in places.items() if found[place] - allowed}
    assert wrong == {}


def test_only_the_verl_glue_imports_verl():
    offenders = [
        f"{path.relative_to(REPO)}: {name}"
        for place in ("recurrent", "taskutils")
        for path in sorted((REPO / place).rglob("*.py"))
        for name in imported_modules(path, REPO)
        if name.split(".")[0] == "verl"
    ]
    assert offenders == []


def test_the_place_table_is_read_as_written(tmp_path):
    # An independent check of the reader: a table by hand, and a planted import across places.
    table = "| place | folder | owns | imports of ours |\n|---|---|---|---|\n| a | `recurrent/` | x | none |\n"
    table += "| b | `recurrent/impls/` | y | `recurrent` |\n| c | `taskutils/` | z | `recurrent`, `recurrent.impls` |\n"
    assert documented_places(table) == {
        "recurrent": set(),
        "recurrent.impls": {"recurrent"},
        "taskutils": {"recurrent", "recurrent.impls"},
    }
    for name, text in {
        "recurrent/__init__.py": "",
        "recurrent/core.py": "def f():\n    from taskutils import tool\n",  # a function-level import counts
        "recurrent/impls/__init__.py": "",
        "recurrent/impls/memory.py": "from verl_ext import glue\n",
        "verl_ext/__init__.py": "",
        "verl_ext/glue.py": "from recurrent import core\n",
        "taskutils/__init__.py": "",
        "taskutils/tool.py": "from recurrent.impls.memory import x\n",
        "experiments/__init__.py": "",
    }.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert imports_across_places(tmp_path) == {
        "recurrent": {"taskutils"},
        "recurrent.impls": {"verl_ext"},
        "verl_ext": {"recurrent"},
        "taskutils": {"recurrent.impls"},
        "experiments": set(),
    }


# --- import circles -------------------------------------------------------------------------------------------------


def import_graph(repo: Path) -> dict[str, set[str]]:
    """Our modules (one a file) -> the modules of ours they import, function-level imports included. A package's
    ``__init__`` is left out as a target: importing ``a.b`` runs ``a/__init__`` without a dependency on it."""
    files = {module_name(p, repo): p for name in PACKAGES for p in (repo / name).rglob("*.py")}
    modules = {name for name, path in files.items() if path.name != "__init__.py"}
    return {
        name: {m for m in imported_modules(path, repo) if m in modules and m != name} for name, path in files.items()
    }


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_circles():
    assert circles(import_graph(REPO)) == []


def test_a_planted_circle_is_found(tmp_path):
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []
    for name, text in {
        "experiments/__init__.py": "",
        "experiments/one.py": "from experiments.two import x\n",
        "experiments/two.py": "def f():\n    from experiments import one\n",  # hidden in a function
        "recurrent/__init__.py": "",
        "verl_ext/__init__.py": "",
        "taskutils/__init__.py": "",
    }.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert circles(import_graph(tmp_path)) == [["experiments.one", "experiments.two"]]


def unreached_modules(repo: Path) -> list[str]:
    """Modules of our packages that no non-test code imports and nothing starts by name (``python -m x.y``,
    ``pkg://x.y``, a class path ``x.y.Class`` in a config or string): in code, scripts, configs or documents."""
    files = project_files(repo)
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


# Modules a maintainer reads in one sitting (docs/architecture.md): no module over 450 lines, no function over 80.
MODULE_LINES, FUNCTION_LINES = 450, 80


def oversized(repo: Path) -> list[str]:
    """Each module over MODULE_LINES lines and each function over FUNCTION_LINES, outside tests and the venvs."""
    found = []
    for path in sorted(p for p in project_files(repo) if p.suffix == ".py"):
        text = path.read_text()
        name = path.relative_to(repo).as_posix()
        if text.count("\n") > MODULE_LINES:
            found.append(f"{name}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > FUNCTION_LINES:
                    found.append(f"{name}: {node.name} {length} lines")
    return found


def test_modules_and_functions_read_in_one_sitting():
    assert oversized(REPO) == []


def test_the_size_check_finds_a_long_module_and_a_long_function(tmp_path):
    (tmp_path / "pkg").mkdir()
    body = "".join(f"    x{k} = {k}\n" for k in range(81))  # 81 body lines + the def line: 82
    (tmp_path / "pkg" / "long.py").write_text("def long():\n" + body + "".join("y = 1\n" for _ in range(400)))
    (tmp_path / "pkg" / "short.py").write_text("def short():\n    return 1\n")
    assert oversized(tmp_path) == ["pkg/long.py: 482 lines", "pkg/long.py: long 82 lines"]
