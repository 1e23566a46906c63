"""A lost Ray node stops the run at once, with a message that says so (docs/cluster.md, "A node lost mid-run").

verl 0.9.1 has no elastic training: when a node of the run goes away (a host crash, a preemption, its raylet
killed), the FSDP ranks, rollout servers and TransferQueue actors on it are gone, and the run cannot finish. What
the driver then sees depends on where the step was: an error from a dead actor some seconds later, or a call
that never returns (a collective, or a request to a store on the dead node, waits without a timeout). So the
driver watches Ray's node table (``ray.nodes()``) in a thread: once a node that was alive during the run is dead,
it prints which node, why Ray says it died, and the last complete checkpoint, and ends the driver with
:data:`EXIT_NODE_LOST`. Ray then ends the run's actors on the surviving nodes (they belong to the driver's job).

Ray declares a node dead after missed health checks (about 15 s with its defaults), so the run stops about that
long after the loss plus one poll. A checkpoint counts only once verl has written
``latest_checkpointed_iteration.txt`` after every rank saved (``trainer_base.py`` ``_save_checkpoint``); a
``global_step_N`` folder beyond it is incomplete and a rerun with ``resume_mode=auto`` ignores it.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

EXIT_NODE_LOST = 75  # sysexits' EX_TEMPFAIL: a temporary failure, the same command may succeed later
POLL_S = 2.0
# How long a failed multi-node run waits for the watch before its error is reported as it is: Ray's default health
# checks declare a killed raylet dead after ~15 s, a host that stops answering after up to ~60 s.
LOSS_CONFIRM_S = 60.0
TRACKER = "latest_checkpointed_iteration.txt"  # verl's checkpoint tracker file
IDLE_DRAIN = 4  # NodeDeathInfo.Reason.AUTOSCALER_DRAIN_IDLE: the autoscaler removed a node that ran nothing


def lost_nodes(seen_alive: set[str], nodes: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The entries of ``nodes`` (``ray.nodes()``) that were alive before (``seen_alive``) and are dead now; nodes
    the autoscaler drained because they were idle held nothing of the run and do not count. Adds the alive
    nodes to ``seen_alive``."""
    lost = []
    for node in nodes:
        if node.get("Alive"):
            seen_alive.add(node["NodeID"])
        elif node["NodeID"] in seen_alive and node.get("DeathReason") != IDLE_DRAIN:
            lost.append(node)
    return lost


def checkpoint_state(checkpoint_dir: str | os.PathLike[str] | None) -> tuple[Path | None, list[Path]]:
    """The last complete checkpoint under ``checkpoint_dir`` (the folder verl's tracker file names, or None) and
    the ``global_step_N`` folders beyond it (incomplete: written, or being written, when the run stopped)."""
    if not checkpoint_dir:
        return None, []
    folder = Path(checkpoint_dir)
    tracker = folder / TRACKER
    last = int(tracker.read_text().strip()) if tracker.is_file() else 0
    beyond = []
    for path in folder.glob("global_step_*"):
        step = path.name.removeprefix("global_step_")
        if step.isdigit() and int(step) > last:
            beyond.append(path)
    complete = folder / f"global_step_{last}" if last else None
    return complete, sorted(beyond, key=lambda p: int(p.name.removeprefix("global_step_")))


def node_lost_message(lost: list[dict[str, Any]], checkpoint_dir: str | os.PathLike[str] | None) -> str:
    names = "; ".join(
        f"{node['NodeID']} ({node.get('NodeManagerAddress', '?')}): {node.get('DeathReasonMessage') or 'no reason'}"
        for node in lost
    )
    complete, beyond = checkpoint_state(checkpoint_dir)
    lines = [f"Ray lost {'a node' if len(lost) == 1 else f'{len(lost)} nodes'} of the run, which stops now: {names}"]
    if complete is not None:
        lines.append(f"last complete checkpoint: {complete}")
    else:
        lines.append(f"no complete checkpoint in {checkpoint_dir}: a rerun starts from the beginning")
    if beyond:
        lines.append(f"incomplete, not resumed from: {', '.join(str(path) for path in beyond)}")
    lines.append("bring the node back (or replace it) and rerun the same command: trainer.resume_mode=auto resumes")
    return "\n  ".join(lines)


class Watch:
    """A look at the run repeated from a daemon thread (every ``poll_s`` once ``ready()``): the first time
    :meth:`check` returns a message, ``on_lost(message)`` is called, once. The watches of the driver
    (:class:`NodeWatch` here, :class:`verl_ext.engine_watch.EngineWatch`) differ only in their check."""

    thread_name = "memagent-watch"

    def __init__(self, checkpoint_dir: str | None, on_lost: Callable[[str], None], poll_s: float = POLL_S) -> None:
        self.checkpoint_dir = checkpoint_dir
        self.on_lost = on_lost
        self.poll_s = poll_s
        self.lost = threading.Event()  # set once something was found, before on_lost runs
        self.message: str | None = None  # what was found
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)

    def start(self) -> Watch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def ready(self) -> bool:
        return True

    def check(self) -> str | None:
        raise NotImplementedError

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            if not self.ready():
                continue
            try:
                message = self.check()
            except Exception:  # the GCS briefly unreachable, Ray not up yet: look again at the next poll
                continue
            if message and not self._stop.is_set():
                self.message = message
                self.lost.set()
                self.on_lost(message)
                return


class NodeWatch(Watch):
    """Polls Ray's node table once Ray is initialized in this process; on a lost node, calls ``on_lost(message)``
    once. ``nodes`` and ``ready`` default to ``ray.nodes`` and ``ray.is_initialized``."""

    thread_name = "memagent-node-watch"

    def __init__(
        self,
        checkpoint_dir: str | None,
        on_lost: Callable[[str], None],
        poll_s: float = POLL_S,
        nodes: Callable[[], list[dict[str, Any]]] | None = None,
        ready: Callable[[], bool] | None = None,
    ) -> None:
        super().__init__(checkpoint_dir, on_lost, poll_s)
        self._nodes = nodes
        self._ready = ready
        self.seen_alive: set[str] = set()

    def ready(self) -> bool:
        return (self._ready or _ray_ready)()

    def check(self) -> str | None:
        """One look at the node table: the message if a node of the run was lost, else None."""
        nodes = self._nodes() if self._nodes else _ray_nodes()
        lost = lost_nodes(self.seen_alive, nodes)
        return node_lost_message(lost, self.checkpoint_dir) if lost else None


def _ray_nodes() -> list[dict[str, Any]]:
    import ray

    return ray.nodes()


def _ray_ready() -> bool:
    import ray

    return ray.is_initialized()


_EXITING = threading.Lock()


def exit_run(message: str, status: int = EXIT_NODE_LOST) -> None:
    """The driver's end when a watch found the run lost: the message, then the process ends here, whatever the main
    thread waits on (``os._exit``: a blocked ``ray.get`` cannot be interrupted otherwise). The watch threads and the
    main thread may all get here; the first prints and ends the process, the others wait for that."""
    _EXITING.acquire()
    print(f"[memagent] {message}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(status)


def exit_on_node_lost(message: str) -> None:
    exit_run(message, EXIT_NODE_LOST)
