"""The command lines that only chat or chunk text (the eval harness, the data CLI, the async client) start
without importing torch: it costs seconds and ~300 MB, and they never touch a tensor."""

import subprocess
import sys

MODULES = (
    "recurrent",
    "recurrent.interface",
    "recurrent.client",
    "recurrent.async_manager",
    "recurrent.generation_manager",
    "recurrent.impls.memory",
    "recurrent.templating",
    "recurrent.trace",
    "recurrent.local_server",
    "taskutils.memory_eval.run",
    "taskutils.memory_data.run",
)


def test_clients_import_without_torch():
    code = f"import sys\nfor m in {MODULES!r}: __import__(m)\nprint(sorted(m for m in sys.modules if m == 'torch'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_rollout_tensors_still_come_with_torch():
    # The async manager imports torch where it builds the rollout's tensors.
    from recurrent.async_manager import _collect

    rollout = _collect([], [], [])
    assert rollout.sample_index.dtype.__str__() == "torch.int64" and rollout.final_mask.tolist() == []
