"""Download the public sources once, on a machine with internet; every later stage reads these files only.

- HotpotQA train v1.1 (``hotpotqa_train.json``; the original scripts read it but never fetched it)
- HotpotQA dev distractor (``hotpotqa_dev.json``)
- SQuAD v2.0 dev (``squad.json``)
- Paul Graham essays (``PaulGrahamEssays.json`` = ``{"text": all essays}``): the ``.txt`` essays of the
  needle-in-a-haystack repository plus the essays linked from paulgraham.com's index, converted from HTML
  to text, as RULER's downloader does (RULER fixes a list of 217 URLs; pass it with ``--essay-urls``).
- LongBench (``THUDM/LongBench``'s ``data.zip``): the six English QA subsets' ``data/{subset}.jsonl``, kept as
  ``longbench/{subset}.jsonl``.
- BABILong (``RMT-team/babilong``): ``data/qa{N}/{config}.json`` of qa1-qa5 at the chosen configs
  (``--babilong-configs``, default all, 0k ... 1M: about 4 GB), kept as ``babilong/qa{N}/{config}.json``.

Files are written to a temporary name and renamed, so an interrupted download never leaves a partial file,
and existing files are kept unless ``--force``.
"""

from __future__ import annotations

import html
import io
import json
import re
import urllib.request
import zipfile
from collections.abc import Callable
from html.parser import HTMLParser
from pathlib import Path

from recurrent.atomic import write_atomic
from taskutils.memory_data.benchmarks import (
    BABILONG_CONFIGS,
    BABILONG_TASKS,
    LONGBENCH_SUBSETS,
    babilong_source,
    longbench_source,
)

SOURCES = {
    "hotpotqa_train": ("http://curtis.ml.cmu.edu/datasets/hotpot/hotpot_train_v1.1.json", "hotpotqa_train.json"),
    "hotpotqa_dev": ("http://curtis.ml.cmu.edu/datasets/hotpot/hotpot_dev_distractor_v1.json", "hotpotqa_dev.json"),
    "squad": ("https://rajpurkar.github.io/SQuAD-explorer/dataset/dev-v2.0.json", "squad.json"),
}
ESSAY_FILE = "PaulGrahamEssays.json"
LONGBENCH_ZIP = "https://huggingface.co/datasets/THUDM/LongBench/resolve/main/data.zip"
BABILONG_FILE = "https://huggingface.co/datasets/RMT-team/babilong/resolve/main/data/{task}/{config}.json"
NIAH_REPO_ZIP = "https://github.com/gkamradt/LLMTest_NeedleInAHaystack/archive/refs/heads/main.zip"
PG_INDEX = "http://www.paulgraham.com/articles.html"
USER_AGENT = "memagent-data/1.0"


def _fetch(url: str, timeout: float = 120.0) -> bytes:
    request = urllib.request.Request(url, headers={"User-Agent": USER_AGENT})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return response.read()


class _TextExtractor(HTMLParser):
    """Plain text of an essay page: paragraphs from <br>/<p>, scripts and styles dropped."""

    def __init__(self) -> None:
        super().__init__()
        self.parts: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag, attrs):
        if tag in ("script", "style"):
            self._skip += 1
        elif tag in ("br", "p"):
            self.parts.append("\n")

    def handle_endtag(self, tag):
        if tag in ("script", "style") and self._skip:
            self._skip -= 1

    def handle_data(self, data):
        if not self._skip:
            self.parts.append(data)


def html_to_text(page: str) -> str:
    extractor = _TextExtractor()
    extractor.feed(page)
    text = html.unescape("".join(extractor.parts))
    return re.sub(r"\n{3,}", "\n\n", text).strip() + "\n"


def essay_urls_from_index(index_html: str) -> list[str]:
    names = sorted(set(re.findall(r'href="([a-z0-9_-]+\.html)"', index_html)))
    return [f"http://www.paulgraham.com/{n}" for n in names if n not in ("index.html", "articles.html")]


def download_essays(dest: Path, urls: list[str] | None = None, log: Callable[[str], None] = print) -> Path:
    """Build ``PaulGrahamEssays.json``: the repository's ``.txt`` essays, then the HTML essays (sorted by name),
    concatenated as RULER does."""
    texts: dict[str, str] = {}
    if urls is None:
        archive = zipfile.ZipFile(io.BytesIO(_fetch(NIAH_REPO_ZIP)))
        for name in sorted(archive.namelist()):
            if "/PaulGrahamEssays/" in name and name.endswith(".txt"):
                texts[Path(name).stem] = archive.read(name).decode("utf-8")
        log(f"essays: {len(texts)} from the needle-in-a-haystack repository")
        urls = essay_urls_from_index(_fetch(PG_INDEX).decode("utf-8", "replace"))
    repo_count = len(texts)
    for url in urls:
        stem = Path(url).stem
        if stem in texts:
            continue
        try:
            page = _fetch(url, timeout=60).decode("utf-8", "replace")
        except OSError as err:
            log(f"essays: skipped {url} ({err})")
            continue
        texts[stem] = page if url.endswith(".txt") else html_to_text(page)
    log(f"essays: {len(texts) - repo_count} downloaded from {len(urls)} URLs")
    names = sorted(texts)
    text = "".join(texts[n] for n in names)
    write_atomic(dest, json.dumps({"text": text}).encode())
    return dest


def download_longbench(folder: Path, force: bool, log: Callable[[str], None] = print) -> list[Path]:
    """The six English QA subsets of LongBench's ``data.zip``, each checked as JSON lines before it is kept."""
    targets = {subset: longbench_source(folder, subset) for subset in LONGBENCH_SUBSETS}
    if all(t.is_file() for t in targets.values()) and not force:
        log(f"{folder / 'longbench'}: present, kept (--force to download again)")
        return []
    log(f"downloading longbench -> {folder / 'longbench'}")
    archive = zipfile.ZipFile(io.BytesIO(_fetch(LONGBENCH_ZIP, timeout=1800)))
    for subset, target in targets.items():
        data = archive.read(f"data/{subset}.jsonl")
        for line in data.splitlines():
            json.loads(line)  # a damaged member fails here, before the file is published
        target.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(target, data)
    return list(targets.values())


def download_babilong(folder: Path, configs: list[str], force: bool, log: Callable[[str], None] = print) -> list[Path]:
    """BABILong qa1-qa5 at ``configs``, one published file each."""
    written = []
    for task in BABILONG_TASKS:
        for config in configs:
            target = babilong_source(folder, task, config)
            if target.is_file() and not force:
                log(f"{target}: present, kept (--force to download again)")
                continue
            log(f"downloading babilong {task} {config} -> {target}")
            data = _fetch(BABILONG_FILE.format(task=task, config=config), timeout=1800)
            json.loads(data)  # a truncated transfer fails here, before the file is published
            target.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(target, data)
            written.append(target)
    return written


def download(
    folder: Path,
    which: list[str],
    force: bool = False,
    essay_urls: Path | None = None,
    log: Callable[[str], None] = print,
    babilong_configs: list[str] | None = None,
) -> list[Path]:
    """Download the named sources (keys of :data:`SOURCES`, ``essays``, ``longbench``, ``babilong``) into
    ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for key in which:
        if key == "longbench":
            written += download_longbench(folder, force, log)
            continue
        if key == "babilong":
            written += download_babilong(folder, babilong_configs or list(BABILONG_CONFIGS), force, log)
            continue
        target = folder / (ESSAY_FILE if key == "essays" else SOURCES[key][1])
        if target.is_file() and not force:
            log(f"{target}: present, kept (--force to download again)")
            continue
        log(f"downloading {key} -> {target}")
        if key == "essays":
            urls = [u.strip() for u in essay_urls.read_text().split() if u.strip()] if essay_urls else None
            download_essays(target, urls, log)
        else:
            data = _fetch(SOURCES[key][0], timeout=600)
            json.loads(data)  # a truncated transfer fails here, before the file is published
            write_atomic(target, data)
        written.append(target)
    return written
