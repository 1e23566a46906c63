"""A scripted HTTP server for tests: an aiohttp app on 127.0.0.1 (a free port), served from its own thread and
event loop, so that synchronous and asynchronous tests alike can talk to it."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

from aiohttp import web


@contextlib.contextmanager
def serve_in_a_thread(
    app: web.Application,
    wait_s: float,
    on_start: Callable[[asyncio.AbstractEventLoop], None] | None = None,
    **runner_options: Any,
) -> Iterator[str]:
    """Serve ``app`` until the block ends; yields its base URL (``http://127.0.0.1:PORT/v1``). ``on_start`` runs in
    the server's thread, on its loop, before the first request; ``runner_options`` go to ``web.AppRunner``."""
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app, shutdown_timeout=0.2, **runner_options)
    ready = threading.Event()
    address: list[str] = []

    def serve() -> None:
        asyncio.set_event_loop(loop)
        if on_start is not None:
            on_start(loop)
        loop.run_until_complete(runner.setup())
        loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", 0).start())
        host, port = runner.addresses[0][:2]
        address.append(f"http://{host}:{port}/v1")
        ready.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())
        loop.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert ready.wait(wait_s), "the scripted server did not start"
    try:
        yield address[0]
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(wait_s)
