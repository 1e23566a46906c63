"""A rollout engine that dies mid-run stops the run with one line naming it (verl_ext/engine_watch.py): a real HTTP
server answers ``/health`` as vLLM's does (200 while its engine runs, 503 once it is dead), the watch is stepped
by hand (``check``), no thread and no timing. The whole path, a vLLM engine core killed under a CPU training run:
tests/verl_ext/cpu/test_cpu_vllm_trainer.py."""

from __future__ import annotations

import threading

from aiohttp import web
from threaded_http import serve_in_a_thread

from verl_ext.engine_watch import EngineWatch, health_problem


def health_server(alive: threading.Event) -> web.Application:
    async def health(request: web.Request) -> web.Response:
        return web.Response(status=200 if alive.is_set() else 503)

    app = web.Application()
    app.router.add_get("/health", health)
    return app


def test_a_server_that_stops_answering_200_is_named_with_the_last_checkpoint(tmp_path):
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("3")
    alive = threading.Event()
    alive.set()
    found: list[str] = []
    with serve_in_a_thread(health_server(alive), wait_s=10) as url:
        address = url.removeprefix("http://").removesuffix("/v1")
        watch = EngineWatch(str(tmp_path), found.append, servers=lambda known: {"vllm_server_0_0": address})
        assert watch.check() is None and watch.healthy == {"vllm_server_0_0"}
        assert health_problem(address) is None
        alive.clear()  # the engine core died: vLLM's /health answers 503
        message = watch.check()
    assert message is not None
    assert f"vllm_server_0_0 at {address} died (answers /health with 503)" in message
    assert str(tmp_path / "global_step_3") in message and "\n" not in message


def test_an_engine_still_starting_is_not_lost():
    """A server that never answered 200 (its engine loading) is watched, not reported."""
    answers = iter(["does not answer /health (refused)", None, "answers /health with 503"])
    watch = EngineWatch(None, print, servers=lambda known: {"vllm_server_1_0": "h:1"}, probe=lambda a: next(answers))
    assert watch.check() is None and watch.healthy == set()
    assert watch.check() is None and watch.healthy == {"vllm_server_1_0"}
    assert "no complete checkpoint" in watch.check()


def test_servers_are_looked_up_once():
    asked: list[set[str]] = []

    def servers(known: set[str]) -> dict[str, str]:
        asked.append(set(known))
        return {} if known else {"vllm_server_0_0": "h:1", "vllm_server_1_0": "h:2"}

    watch = EngineWatch(None, print, servers=servers, probe=lambda a: None)
    watch.check()
    watch.check()
    assert asked == [set(), {"vllm_server_0_0", "vllm_server_1_0"}]
    assert watch.addresses == {"vllm_server_0_0": "h:1", "vllm_server_1_0": "h:2"}


def test_a_closed_port_is_a_problem():
    with serve_in_a_thread(web.Application(), wait_s=10) as url:
        address = url.removeprefix("http://").removesuffix("/v1")
    assert health_problem(address, timeout=5).startswith("does not answer /health")
