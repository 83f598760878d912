"""The life cycle of `specdec serve`: uvicorn serving the app from a thread of its own while
the main thread steps the scheduler, the signals caught, and the drain (no new requests: 503;
the running ones finish, up to --drain-timeout, after which the scheduler cancels them and each
gets a 503 with OpenAI's error body and Retry-After)."""
from __future__ import annotations

import signal
import threading

from fastapi import FastAPI

from .scheduler import Scheduler

DRAIN_GRACE_S = 5       # after the drain deadline's 503s, uvicorn's own shutdown deadline


def run_server(app: FastAPI, host: str, port: int, log=print, scheduler: Scheduler | None = None,
               drain_s: float = 30.0) -> int:
    """Serve until Ctrl-C / SIGTERM, then drain (uvicorn waits for open requests, the app's
    shutdown for the scheduler) and return 0.

    scheduler: one made with start=False, stepped here in the calling (main) thread while
    uvicorn serves from a thread of its own (Scheduler's docstring says why); the signals
    are caught here and handed to uvicorn.  drain_s: the running requests get this long to
    finish; then the scheduler cancels them, and each gets a 503 with OpenAI's error body and
    Retry-After (uvicorn, given a few seconds more, would otherwise drop them with a bare 500)."""
    import uvicorn

    from .linger import LingeringH11Protocol      # a refused body's answer reaches the client

    class _Server(uvicorn.Server):
        async def startup(self, sockets=None):
            await super().startup(sockets)
            if self.started:
                log(f"specdec: serving on http://{host}:{port} (OpenAI API at http://{host}:{port}/v1)")

        def handle_exit(self, sig, frame):
            super().handle_exit(sig, frame)
            self._captured_signals.clear()          # a drained shutdown is a clean exit

    server = _Server(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                    http=LingeringH11Protocol,
                                    timeout_graceful_shutdown=drain_s + DRAIN_GRACE_S))
    if scheduler is None:
        server.run()
        return 0 if server.started else 1
    http = threading.Thread(target=server.run, name="specdec-http", daemon=True)

    def watch():                    # uvicorn gone (drained, or it never started): stop stepping
        http.join()
        scheduler.close()

    def on_signal(sig, frame):                  # drain now: queued requests get 503 at once
        scheduler.drain()
        if not server.should_exit:              # the first signal starts the drain deadline
            deadline = threading.Timer(drain_s, scheduler.cancel_all,
                                       ("the server shut down before the request finished: retry it",))
            deadline.daemon = True
            deadline.start()
        server.handle_exit(sig, frame)

    old = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        http.start()
        threading.Thread(target=watch, name="specdec-http-watch", daemon=True).start()
        scheduler.run()
        http.join(timeout=60)
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)
    return 0 if server.started else 1
