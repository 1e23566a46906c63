"""scripts/lib/stages.sh, the stage helpers of the one-command pipelines (scripts/replicate_cpu.sh,
experiments/calculator/run.sh): the lines they append to timing.jsonl and run.jsonl (read by
experiments/needle/report.py), a failed stage's exit, a run folder's last step."""

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

SCRIPT = """
set -euo pipefail
PIPELINE=demo
source "$REPO/scripts/lib/stages.sh"
record_run "STEPS=2 SEEDS='0 1'" "bash demo.sh $*"
say "hello"
echo "last: $(last_step "$OUT_DIR/run") $(last_step "$OUT_DIR/none")"
timed good true
record_total
timed bad bash -c 'exit 3'
echo "not reached"
"""


def test_the_stage_helpers_write_what_the_report_reads(tmp_path: Path):
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    (tmp_path / "run" / "checkpoints" / "latest_checkpointed_iteration.txt").write_text("7\n")
    env = {"REPO": str(REPO), "PYTHON": sys.executable, "OUT_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        ["bash", "-c", SCRIPT, "demo", "x=1"], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 3, done.stderr  # the failed stage's exit status
    lines = done.stdout.splitlines()
    assert lines[0].startswith("[demo ") and lines[0].endswith("] hello")
    assert lines[1] == "last: 7 0"
    assert lines[2].endswith("] stage 'bad' failed (exit 3); run the same command again to resume")
    assert "not reached" not in done.stdout
    timing = [json.loads(line) for line in (tmp_path / "timing.jsonl").read_text().splitlines()]
    assert [(t["stage"], t["rc"]) for t in timing] == [("good", 0), ("total", 0), ("bad", 3)]
    assert all(isinstance(t["seconds"], int) and t["seconds"] >= 0 for t in timing)
    (run,) = [json.loads(line) for line in (tmp_path / "run.jsonl").read_text().splitlines()]
    assert run["command"] == "STEPS=2 SEEDS='0 1' bash demo.sh x=1"
    assert set(run) == {"commit", "command", "cores", "started"} and run["cores"] >= 1 and run["commit"]
