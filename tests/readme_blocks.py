"""The README's shell blocks as the tests read them (a plain module: test files import it by name)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_commands(section: str) -> tuple[dict[str, str], list[list[str]]]:
    """The first ```bash block after the heading ``section``: its variable assignments, and its commands as argv
    lists (continuation lines joined, comments dropped)."""
    text = README.read_text().split(section, 1)[1]
    block = text.split("```bash\n", 1)[1].split("```", 1)[0]
    variables, commands = {}, []
    for line in block.replace("\\\n", " ").splitlines():
        argv = shlex.split(line, comments=True)
        if len(argv) == 1 and re.fullmatch(r"[A-Z_]+=\S+", argv[0]):
            name, value = argv[0].split("=", 1)
            variables[name] = value
        elif argv:
            commands.append(argv)
    return variables, commands
