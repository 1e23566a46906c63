"""The report of scripts/smoke_gpu.sh: time per phase, GPU memory as verl records it, and whether the run did it all.

    python scripts/smoke_report.py --metrics OUT/metrics.jsonl --log OUT/train.log --checkpoints OUT/checkpoints

Reads what verl itself records, and names each memory figure for what it is (verl 0.9.1; docs/cluster.md):
- the file logger's JSONL: ``timing_s/<phase>`` per step, and ``actor/perf/max_memory_allocated_gb`` /
  ``max_memory_reserved_gb``. These are torch's peak counters of the actor's worker processes, which nothing in
  verl resets: each step's value is the peak since the worker started (model loading, every earlier step, and this
  step's old-log-prob and reference passes, which run in the same process), read after each update mini-batch, the
  largest over mini-batches and ranks. Not the update's own peak, and not per phase; vLLM's processes not included.
- the lines of verl's memory logging (``<point>, memory allocated (GB): a, memory reserved (GB): r, device memory
  used/total (GB): u/t``, printed by rank 0 of the actor workers with VERL_LOGGING_LEVEL=DEBUG): samples of the
  current values at fixed points (around the weight sync, model loading and offloading), not peaks over a phase;
  ``used`` is the whole GPU's (every process on it, vLLM's included).
Exits 1 when a step, the validation or the checkpoint is missing, so a run that "finished" without doing its work
is a failure too.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

# verl 0.9.1's V1 trainer phases (marked_timer names), in the order a step runs them.
PHASES = (
    "gen",
    "reward",
    "old_log_prob",
    "ref",
    "adv",
    "update_actor",
    "update_weights",
    "testing",
    "save_checkpoint",
    "step",
)
# The actor's torch peak counters as verl logs them after each update (see the docstring for what they cover).
PEAK_METRICS = {
    "actor/perf/max_memory_allocated_gb": "allocated",
    "actor/perf/max_memory_reserved_gb": "reserved",
}
PEAK_HEADER = (
    "actor GPU memory, peak since the worker started, read after each step's update (GB, largest rank; torch's",
    "  counters, never reset by verl: they include model loading, earlier steps and this step's old-log-prob and",
    "  reference passes; not the update's own peak, not per phase; vLLM's processes not included):",
)
POINTS_HEADER = (
    "GPU memory at verl's logged points (rank 0, GB; the largest sample of each point, not a peak over a phase;",
    "  used: the whole GPU, every process on it):",
)
MEMORY_LINE = re.compile(
    r"([A-Za-z][A-Za-z0-9_/ -]*), memory allocated \(GB\): ([\d.]+), memory reserved \(GB\): ([\d.]+), "
    r"device memory used/total \(GB\): ([\d.]+)/([\d.]+)"
)


def read_metrics(path: Path) -> dict[int, dict]:
    """verl's file logger: one JSON line ``{"step": N, "data": {...}}`` per log call; merged per step."""
    steps: dict[int, dict] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            steps.setdefault(int(record["step"]), {}).update(record["data"])
    return steps


def memory_samples(log: str) -> dict[str, tuple[float, float, float, float]]:
    """(allocated, reserved, device used, device total) in GB at each point of verl's memory logging, the largest
    of that point's samples over the run (a point such as "After resume weights" is logged once per step)."""
    largest: dict[str, tuple[float, float, float, float]] = {}
    for match in MEMORY_LINE.finditer(log):
        point, values = match.group(1).strip(), tuple(float(v) for v in match.groups()[1:])
        old = largest.get(point, (0.0, 0.0, 0.0, 0.0))
        largest[point] = (max(old[0], values[0]), max(old[1], values[1]), max(old[2], values[2]), values[3])
    return largest


def report(steps: dict[int, dict], memory: dict[str, tuple[float, float, float, float]]) -> str:
    """The tables: seconds per phase and step; the actor's peak counters per step; memory at verl's logged points."""
    numbered = sorted(steps)
    header = "  " + f"{'phase':<16}" + "".join(f"{s:>10}" for s in numbered)
    lines = ["phase seconds per step (timing_s/*):", header]
    for phase in PHASES:
        values = [steps[s].get(f"timing_s/{phase}") for s in numbered]
        if any(v is not None for v in values):
            cells = "".join(f"{'-':>10}" if v is None else f"{float(v):>10.1f}" for v in values)
            lines.append(f"  {phase:<16}{cells}")
    peaks = [(key, name) for key, name in PEAK_METRICS.items() if any(key in steps[s] for s in numbered)]
    if peaks:
        lines.extend(PEAK_HEADER)
        lines.append("  " + f"{'peak so far':<16}" + "".join(f"{s:>10}" for s in numbered))
        for key, name in peaks:
            values = [steps[s].get(key) for s in numbered]
            cells = "".join(f"{'-':>10}" if v is None else f"{float(v):>10.2f}" for v in values)
            lines.append(f"  {name:<16}{cells}   ({key})")
    lines.extend(POINTS_HEADER)
    if not memory:
        lines.append("  (no memory lines in the log: VERL_LOGGING_LEVEL=DEBUG shows them)")
    else:
        lines.append(f"  {'point':<48}{'allocated':>10}{'reserved':>10}{'used':>10}{'total':>10}")
        for point, (alloc, reserved, used, total) in memory.items():
            lines.append(f"  {point:<48}{alloc:>10.2f}{reserved:>10.2f}{used:>10.2f}{total:>10.2f}")
    return "\n".join(lines)


def problems(steps: dict[int, dict], checkpoints: Path, total_steps: int) -> list[str]:
    """What a complete smoke run has and this one lacks."""
    found = []
    for step in range(1, total_steps + 1):
        if "timing_s/step" not in steps.get(step, {}):
            found.append(f"training step {step} has no metrics (timing_s/step)")
    validated = sorted(s for s, data in steps.items() if any(k.startswith("val-core/") for k in data))
    if 0 not in validated:  # verl logs the validation before training at step 0
        found.append("no validation before training (val-core/* at step 0)")
    if total_steps not in validated:
        found.append(f"no validation at step {total_steps} (val-core/*)")
    if not (checkpoints / f"global_step_{total_steps}").is_dir():
        found.append(f"no checkpoint {checkpoints / f'global_step_{total_steps}'}")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--metrics", type=Path, required=True)
    parser.add_argument("--log", type=Path, required=True)
    parser.add_argument("--checkpoints", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args(argv)
    steps = read_metrics(args.metrics) if args.metrics.is_file() else {}
    log = args.log.read_text(errors="replace") if args.log.is_file() else ""
    print(report(steps, memory_samples(log)))
    missing = problems(steps, args.checkpoints, args.steps)
    for problem in missing:
        print(f"[smoke] FAILED: {problem}")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
