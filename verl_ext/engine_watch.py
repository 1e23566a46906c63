"""A rollout engine that dies mid-run stops the run at once, with one line that names it (docs/cluster.md, "A rollout
engine lost mid-run").

verl's vLLM replica runs vLLM's engine core in a process of its own under the ``vLLMHttpServer`` actor. When that
process dies (killed, out of memory, a crash in a kernel) the actor lives on: every request in flight fails with
vLLM's ``EngineDeadError``, the step's trajectories are recorded as failed, and the next weight sync into the dead
engine waits forever (measured on CPU: a run stuck after its checkpoint, no exit, until stopped by hand). So the
driver watches each vLLM server's own ``GET /health`` (vLLM answers 200 while its engine runs, an error once it is
dead) from a thread, as :mod:`verl_ext.node_watch` watches Ray's nodes: once a server that answered is down, it
prints which one, its address and answer, and the last complete checkpoint, and ends the driver with
:data:`EXIT_ENGINE_LOST`; Ray then ends the run's actors.

The servers are found by the names verl gives them (``vllm_server_{replica}_{node}``,
``vllm_async_server.py`` ``launch_servers``), so this needs nothing from the trainer's code.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from verl_ext.node_watch import Watch, checkpoint_state, exit_run

EXIT_ENGINE_LOST = 75  # as a lost node: a temporary failure, the same command resumes from the last checkpoint
POLL_S = 2.0
HEALTH_TIMEOUT_S = 10.0  # a busy CPU engine answers /health from its API server's event loop, not the engine
SERVER_PREFIX = "vllm_server_"  # verl's names for the rollout's vLLM servers (not the reward or teacher models')


def health_problem(address: str, timeout: float = HEALTH_TIMEOUT_S) -> str | None:
    """Why ``http://{address}/health`` is not a 200, or None when it is."""
    try:
        with urllib.request.urlopen(f"http://{address}/health", timeout=timeout) as response:
            return None if response.status == 200 else f"answers /health with {response.status}"
    except urllib.error.HTTPError as err:
        return f"answers /health with {err.code}"
    except OSError as err:  # refused, reset, timed out
        return f"does not answer /health ({getattr(err, 'reason', None) or err})"


def engine_lost_message(name: str, address: str, problem: str, checkpoint_dir: str | None) -> str:
    complete, _ = checkpoint_state(checkpoint_dir)
    resume = f"last complete checkpoint: {complete}" if complete else "no complete checkpoint: a rerun starts over"
    return (
        f"the rollout engine of {name} at {address} died ({problem}); the run stops now. {resume}; "
        "rerun the same command to resume (the engine's own error is in the run's log)"
    )


class EngineWatch(Watch):
    """Polls the rollout servers' health; calls ``on_lost(message)`` once when a server that answered 200 no longer
    does. ``servers`` (given the names known, ``name -> address`` of the servers registered since) and ``probe``
    (:func:`health_problem`) can be given."""

    thread_name = "memagent-engine-watch"

    def __init__(
        self,
        checkpoint_dir: str | None,
        on_lost: Callable[[str], None],
        poll_s: float = POLL_S,
        servers: Callable[[set[str]], dict[str, str]] | None = None,
        probe: Callable[[str], str | None] = health_problem,
    ) -> None:
        super().__init__(checkpoint_dir, on_lost, poll_s)
        self._servers = servers or _vllm_servers
        self._probe = probe
        self.addresses: dict[str, str] = {}  # every server found: name -> address
        self.healthy: set[str] = set()  # the servers seen answering 200

    def check(self) -> str | None:
        """One look: the message if a server seen healthy is down now, else None (new servers are added once they
        answer: an engine still starting is not lost)."""
        self.addresses.update(self._servers(set(self.addresses)))
        for name, address in self.addresses.items():
            problem = self._probe(address)
            if problem is None:
                self.healthy.add(name)
            elif name in self.healthy:
                return engine_lost_message(name, address, problem, self.checkpoint_dir)
        return None


def _vllm_servers(known: set[str]) -> dict[str, str]:
    """``name -> host:port`` of the rollout's vLLM servers registered in Ray and not in ``known`` (none before Ray
    is up)."""
    import ray

    if not ray.is_initialized():
        return {}
    servers = {}
    for entry in ray.util.list_named_actors(all_namespaces=True):
        name = entry["name"] if isinstance(entry, dict) else entry
        if not name.startswith(SERVER_PREFIX) or name in known:
            continue
        namespace = entry.get("namespace") if isinstance(entry, dict) else None
        handle = ray.get_actor(name, namespace=namespace)
        # the attributes get_server_address returns, read without its assertion (it raises until the HTTP server is
        # up, and Ray logs every such error); None until then
        address = handle.__ray_call__.remote(lambda server: (server._server_address, server._server_port))
        host, port = ray.get(address, timeout=HEALTH_TIMEOUT_S)
        if port is not None:
            servers[name] = f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
    return servers


def exit_on_engine_lost(message: str) -> None:
    """The driver's end when a rollout engine died (:func:`verl_ext.node_watch.exit_run`: the main thread may wait
    on a call into the dead engine that never returns)."""
    exit_run(message, EXIT_ENGINE_LOST)


def start(config: Any) -> EngineWatch | None:
    """The watch for a run whose rollout is vLLM (verl's ``vLLMHttpServer``), else None."""
    if config.actor_rollout_ref.rollout.name != "vllm":
        return None
    return EngineWatch(config.trainer.get("default_local_dir"), exit_on_engine_lost).start()
