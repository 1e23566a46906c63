"""Old against new settings of the replication's evaluation, side by side in one run, on a slice of the test split.

    python scripts/bench_eval_replication.py                       # 16 documents at 16 and 64 chunks, 2 policies
    python scripts/bench_eval_replication.py --settings old=8x1 c16=16x1 new=8x2 --docs 16 --lengths 16,64

Each setting runs the harness as the replication's stage 5 does (``python -m taskutils.memory_eval.run`` on a
reader table from ``experiments.needle.eval_models``, ``transformers serve`` with continuous batching, method
``memory-boxed``, greedy) with ``--concurrency C --parallel-models P`` (a setting ``NAME=CxP``), the servers
computing in the harness's dtype (fp32 on CPU) or in the one a setting names (``NAME=CxP:DTYPE``, ``--dtype`` of
``transformers serve``: ``auto`` is the checkpoint config's, bf16 for verl's exports), with the harness's
``--cb-max-batch-tokens`` or the one a setting names (``NAME=CxP/TOKENS``: the query tokens of one batched step).
The policies are the same reader listed ``--policies`` times under different names, so every setting does the
work of that many policies. Printed per setting: wall time, documents and turns per second, the CPU time of the
servers and of the harness (sampled from /proc every 0.2 s over the harness's process tree), and the load average
before and after (the machine may be shared: compare settings of the same run, and ``--repeat`` interleaves them).
Then every setting's results are compared with the first's, item by item: the answer, the token counts and every
turn's text (``--trace``) must be identical, since greedy decoding does not depend on how requests are scheduled;
settings of another dtype compute other numbers, so their answers are compared with the first of their dtype, and
every setting's strict accuracy is printed.

The reader: ``--reader`` or the warm start in the model cache (``replication-reader``), else the quick untrained
one (built in seconds, ``python -m experiments.needle.warm_start --cache --quick``). The data: ``--data-dir``
(a folder of ``eval_needle_{N}.jsonl``) or built from the reader's tokenizer by ``experiments.needle.data``.
The environment is passed on as is: run it like the replication, with ``OMP_NUM_THREADS=1``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from experiments.needle import eval_models  # noqa: E402
from recurrent.models import models_dir  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


@dataclass
class Setting:
    name: str
    concurrency: int
    parallel: int
    dtype: str | None = None  # transformers serve's --dtype; None: the harness's (recurrent.local_server.CPU_DTYPE)
    batch_tokens: int | None = None  # --cb-max-batch-tokens; None: the harness's (experiments.needle.eval_models)


@dataclass
class Measure:
    wall: float = 0.0
    cpu: float = 0.0  # every process of the run (rusage of the waited children)
    server_cpu: float = 0.0  # the `transformers serve` processes (sampled)
    load_before: str = ""
    load_after: str = ""
    rc: int = 0
    results: dict = field(default_factory=dict)  # (file, model, id) -> what must not change


def parse_setting(text: str) -> Setting:
    name, sep, spec = text.partition("=")
    spec, slash, tokens = spec.partition("/")
    spec, colon, dtype = spec.partition(":")
    conc, x, par = spec.partition("x")
    ok = sep and name and x and conc.isdigit() and par.isdigit() and int(conc) > 0 and int(par) > 0
    if not ok or (colon and not dtype) or (slash and not (tokens.isdigit() and int(tokens) > 0)):
        raise argparse.ArgumentTypeError(
            "expected NAME=CxP[:DTYPE][/TOKENS] (concurrency x models side by side, the servers' dtype, their "
            f"--cb-max-batch-tokens), got {text!r}"
        )
    return Setting(name, int(conc), int(par), dtype or None, int(tokens) if slash else None)


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def process_tree(root: int) -> dict[int, tuple[str, float]]:
    """pid -> (command line, CPU seconds so far) of ``root`` and its descendants."""
    children: dict[int, list[int]] = {}
    stats: dict[int, tuple[str, float]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        children.setdefault(int(fields[1]), []).append(int(entry.name))
        stats[int(entry.name)] = (cmd, (int(fields[11]) + int(fields[12])) / TICK)
    tree, todo = {}, [root]
    while todo:
        pid = todo.pop()
        if pid in stats:
            tree[pid] = stats[pid]
        todo.extend(children.get(pid, []))
    return tree


def results_of(folder: Path) -> dict:
    out = {}
    for path in sorted(folder.glob("needle_*/*.jsonl")):
        for line in path.read_text().splitlines():
            r = json.loads(line)
            turns = [{k: v for k, v in t.items() if k != "seconds"} for t in r.get("trace") or []]  # text, tokens
            key = (path.parent.name, r["model"], r["id"])
            out[key] = (r.get("error"), r["response"], r["prompt_tokens"], r["completion_tokens"], r["memories"], turns,
                        r["strict"])  # fmt: skip
    return out


def setting_table(setting: Setting, table: Path, out: Path) -> Path:
    """The reader table of a setting: ``table``, its servers' ``--dtype`` and ``--cb-max-batch-tokens`` set when the
    setting names them."""
    if setting.dtype is None and setting.batch_tokens is None:
        return table
    data = yaml.safe_load(table.read_text())
    args = list(data["defaults"]["transformers_args"])
    if setting.dtype is not None:
        args += ["--dtype", setting.dtype]
    if setting.batch_tokens is not None:
        args[args.index("--cb-max-batch-tokens") + 1] = str(setting.batch_tokens)
    data["defaults"]["transformers_args"] = args
    path = out / f"policies-{setting.name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def run_setting(setting: Setting, table: Path, data: Path, args: argparse.Namespace, out: Path) -> Measure:
    results_dir = out / setting.name
    cmd = [
        sys.executable, "-m", "taskutils.memory_eval.run", "--table", str(setting_table(setting, table, out)),
        "--tasks", "needle",
        "--lengths", args.lengths, "--limit", str(args.docs), "--data-dir", str(data), "--method", "memory-boxed",
        "--temperature", "0", "--trace", "--no-report", "--quiet", "--overwrite", "--results-dir", str(results_dir),
        "--concurrency", str(setting.concurrency), "--parallel-models", str(setting.parallel),
    ]  # fmt: skip
    m = Measure(load_before=loadavg())
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    with (out / f"{setting.name}.log").open("w") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        servers: dict[int, float] = {}
        done = threading.Event()

        def sample() -> None:
            while not done.wait(0.2):
                for pid, (cmdline, cpu) in process_tree(proc.pid).items():
                    if " serve " in cmdline and pid != proc.pid:
                        servers[pid] = cpu

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        m.rc = proc.wait()
        done.set()
        sampler.join()
    m.wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    m.cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    m.server_cpu = sum(servers.values())
    m.load_after = loadavg()
    m.results = results_of(results_dir)
    return m


def default_reader() -> Path:
    full = models_dir() / "replication-reader"
    if (full / "config.json").is_file():
        return full
    from experiments.needle.warm_start import cached_warm_start

    return Path(cached_warm_start(quick=True, log=lambda *a, **k: None))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reader", type=Path, help="reader folder (default: the cached warm start, else quick)")
    parser.add_argument("--data-dir", type=Path, help="folder of eval_needle_{N}.jsonl (default: built)")
    parser.add_argument("--docs", type=int, default=16, help="documents per length (default 16)")
    parser.add_argument("--lengths", default="16,64", help="comma list of chunk counts (default 16,64)")
    parser.add_argument("--policies", type=int, default=2, help="policies (the reader under N names; default 2)")
    parser.add_argument(
        "--settings",
        nargs="+",
        type=parse_setting,
        default=[parse_setting("old=8x1"), parse_setting("new=8x2")],
        metavar="NAME=CxP",
        help="concurrency x models side by side; the first is the reference (default: old=8x1 new=8x2)",
    )
    parser.add_argument("--repeat", type=int, default=1, help="run the settings this many times, interleaved")
    parser.add_argument("--out", type=Path, help="work folder (default: a temporary one)")
    args = parser.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="bench-eval-replication-"))
    out.mkdir(parents=True, exist_ok=True)
    reader = (args.reader or default_reader()).resolve()
    lengths = [int(n) for n in args.lengths.split(",")]
    data = args.data_dir
    if data is None:
        data = out / "data" / "eval" / "test"
        if not all((data / f"eval_needle_{n}.jsonl").is_file() for n in lengths):
            cmd = [sys.executable, "-m", "experiments.needle.data", "--out", str(out / "data"), "--tokenizer"]
            cmd += [str(reader), "--train", "0", "--validation", "0", "--test", str(args.docs), "--eval-chunks"]
            subprocess.run([*cmd, *map(str, lengths)], cwd=REPO, check=True, stdout=subprocess.DEVNULL)
    table = out / "policies.yaml"
    eval_models.main([*(f"p{k}={reader}" for k in range(args.policies)), "--out", str(table)])
    docs = args.docs * len(lengths) * args.policies
    turns = args.docs * sum(n + 1 for n in lengths) * args.policies
    threads = os.environ.get("OMP_NUM_THREADS", "unset")
    print(f"reader {reader.name}; {args.docs} documents x lengths {lengths} x {args.policies} policies = {docs} "
          f"documents, {turns} turns; OMP_NUM_THREADS={threads}", flush=True)  # fmt: skip
    header = f"{'setting':10} {'conc':>4} {'par':>3} {'dtype':>8} {'tokens':>6} {'wall s':>7} {'docs/s':>7} "
    header += f"{'turns/s':>7} {'CPU s':>6} {'server':>6} {'harness':>7} {'strict%':>7}  load before -> after"
    print(header, flush=True)
    runs: list[tuple[Setting, Measure]] = []
    for _ in range(args.repeat):
        for s in args.settings:
            m = run_setting(s, table, data, args, out)
            runs.append((s, m))
            strict = 100 * sum(v[-1] for v in m.results.values()) / max(len(m.results), 1)
            print(
                f"{s.name:10} {s.concurrency:4d} {s.parallel:3d} {s.dtype or 'default':>8} "
                f"{s.batch_tokens or 'default':>6} {m.wall:7.1f} "
                f"{docs / m.wall:7.3f} {turns / m.wall:7.1f} {m.cpu:6.1f} {m.server_cpu:6.1f} "
                f"{m.cpu - m.server_cpu:7.1f} {strict:7.1f}  {m.load_before} -> {m.load_after}"
                + (f"  (exit {m.rc}: see {out / s.name}.log)" if m.rc else ""),
                flush=True,
            )
    ok = True
    firsts: dict[str | None, tuple[Setting, Measure]] = {}
    for s, m in runs:
        ref_setting, ref = firsts.setdefault(s.dtype, (s, m))
        same = sum(m.results.get(k) == v for k, v in ref.results.items())
        errors = sum(v[0] is not None for v in m.results.values())
        complete = len(m.results) == docs
        print(f"{s.name}: {same}/{len(ref.results)} items identical to {ref_setting.name}, {len(m.results)} results "
              f"(expected {docs}), {errors} failed")  # fmt: skip
        ok &= same == len(ref.results) == len(m.results) and complete and errors == 0 and m.rc == 0
    verdict = "answers identical across settings of one dtype" if ok else "DIFFERENT answers or incomplete runs"
    print(verdict, flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
