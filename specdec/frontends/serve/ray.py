"""`specdec serve --ray-replicas N`: the same FastAPI app and Scheduler as `specdec serve`, as a
Ray Serve deployment (`pip install 'specdec[ray]'`).

    specdec serve -m MODEL -np 4 -t 1 --ray-replicas 2 [--ray-max-replicas 4] [--ray-address ADDR]

Each replica is one Ray actor process with its own models, -np slots and -t threads (its
`ray_actor_options` num_cpus): a thread of its own loads and warms the models and then steps
the scheduler (serve/launch.py `build`, the code `specdec serve` runs; numba's OpenMP team stays
that thread's, as in `specdec serve`'s main thread).  Ray's HTTP proxy at --host/--port routes
each request to a replica with a free slot: a replica takes at most -np requests at once
(`max_ongoing_requests`), the others wait in Ray's router (at most --queue-size per proxy;
beyond: 503); --ray-max-replicas autoscales on those queued requests (`target_ongoing_requests`
= -np).  The OpenAI routes are unchanged; every response names its replica in the
`X-Specdec-Replica` header.  docs/serve.md ("Ray Serve") says what a replica keeps.
"""
from __future__ import annotations

import asyncio
import copy
import os
import re
import signal
import threading

from ...errors import ConfigError

APP_NAME = "specdec"
DEPLOYMENT = "SpecdecServe"
REPLICA_HEADER = "x-specdec-replica"
EXPORT_S = 5.0                  # seconds between two copies of /metrics into Ray's metrics


def require_ray(flag: str = "--ray-replicas"):
    """(ray, ray.serve), or a ConfigError naming the flag and the extra to install."""
    try:
        import ray
        from ray import serve
    except ImportError:
        raise ConfigError(f"{flag} needs Ray Serve: pip install 'specdec[ray]'") from None
    return ray, serve


def check(a, draft_options=None) -> None:
    """The Ray flags and every server flag that needs no model, checked before a cluster starts."""
    from .launch import check_flags
    from .draft_caps import DraftCaps
    if a.ray_replicas < 1:
        raise ConfigError(f"--ray-replicas must be >= 1, got {a.ray_replicas}")
    if a.ray_max_replicas is not None and a.ray_max_replicas < a.ray_replicas:
        raise ConfigError(f"--ray-max-replicas must be >= --ray-replicas ({a.ray_replicas}), "
                          f"got {a.ray_max_replicas}")
    if a.parallel < 1 or a.queue_size < 0:
        raise ConfigError("--parallel must be >= 1 and --queue-size >= 0")
    check_flags(a)
    DraftCaps.parse(a.draft_caps, a.lookup_caps)
    if draft_options is not None:
        draft_options(copy.copy(a))                 # the drafting and quant flags (no store kept)


def deployment_options(a) -> dict:
    """serve.deployment's options for the flags: num_cpus = -t per replica, at most -np requests
    in a replica, --queue-size waiting per proxy, a fixed count or autoscaling on the queue."""
    opts = dict(name=DEPLOYMENT, ray_actor_options={"num_cpus": a.threads},
                max_ongoing_requests=a.parallel, max_queued_requests=max(1, a.queue_size),
                graceful_shutdown_timeout_s=30, health_check_period_s=5, max_constructor_retry_count=3)
    if a.ray_max_replicas is not None and a.ray_max_replicas > a.ray_replicas:
        opts["autoscaling_config"] = {"min_replicas": a.ray_replicas, "initial_replicas": a.ray_replicas,
                                      "max_replicas": a.ray_max_replicas,
                                      "target_ongoing_requests": a.parallel}
    else:
        opts["num_replicas"] = a.ray_replicas
    return opts


class ReplicaHeader:
    """ASGI middleware: every HTTP response carries `X-Specdec-Replica: <replica id>`."""

    def __init__(self, app, replica: str):
        self.app, self.value = app, replica.encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_tagged(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), (REPLICA_HEADER.encode(), self.value)]}
            await send(message)
        return await self.app(scope, receive, send_tagged)


class Replica:
    """One Ray Serve replica: `specdec serve`'s app over its own models and Scheduler.  A thread
    of its own builds them (loads and warms the models) and then steps the scheduler until the
    app's shutdown closes it.  Wrapped by serve.ingress() / serve.deployment in `bind`."""

    async def __init__(self, a, helpers: dict):
        from ray import serve
        try:
            self.replica = serve.get_replica_context().replica_tag
        except Exception:                   # noqa: BLE001 - outside a replica (a direct test)
            self.replica = f"pid-{os.getpid()}"
        self.asgi = self.scheduler = self.error = None
        ready = threading.Event()
        self.thread = threading.Thread(target=self._main, args=(a, helpers, ready),
                                       name="specdec-scheduler", daemon=True)
        self.thread.start()
        await asyncio.to_thread(ready.wait)
        if self.error is not None:
            raise self.error
        self.asgi.add_middleware(ReplicaHeader, replica=self.replica)
        threading.Thread(target=self._export, name="specdec-metrics", daemon=True).start()

    def _main(self, a, helpers: dict, ready: threading.Event) -> None:
        from .launch import build
        try:
            self.asgi, self.scheduler = build(a, **helpers)
        except BaseException as e:          # noqa: BLE001 - raised again by the constructor
            self.error = e
            return
        finally:
            ready.set()
        self.scheduler.run()

    def __serve_build_asgi_app__(self):
        return self.asgi

    def check_health(self) -> None:
        """Ray Serve's health check: a replica whose scheduler thread stopped is replaced."""
        if not self.thread.is_alive():
            raise RuntimeError("the scheduler thread of this replica stopped")

    def _export(self) -> None:
        """Copy this replica's /metrics into Ray's metrics every EXPORT_S seconds (each node
        exports them, tagged with the replica, as ray_specdec_*: sum over replicas there)."""
        from ray.serve.metrics import Gauge
        gauges: dict = {}
        while self.thread.is_alive():
            s = self.scheduler
            text = s.metrics.render(s.gauges(), {"model": s.caps.table, "prompt-lookup": s.caps.lookup})
            for name, labels, value in samples(text):
                if name not in gauges:
                    gauges[name] = Gauge(name, "specdec serve's " + name, tag_keys=tuple(sorted(labels)))
                gauges[name].set(value, tags=labels or None)
            self.thread.join(EXPORT_S)


_SAMPLE = re.compile(r'^([a-zA-Z_:][\w:]*)(?:\{(.*)\})? (\S+)$')


def samples(text: str) -> list[tuple[str, dict, float]]:
    """(name, labels, value) of each sample of a Prometheus text exposition."""
    out = []
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m and not line.startswith("#"):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
            out.append((m.group(1), labels, float(m.group(3))))
    return out


SUMMABLE = re.compile(r"_total$|^specdec_(queue_length|slots_busy|slots_total)$")


def sum_metrics(texts: list[str]) -> dict[tuple, float]:
    """The cluster's figures from each replica's /metrics: counters (`*_total`) and the queue
    and slot gauges summed per (name, labels); ratios, means and the last step's figures are
    per replica and left out."""
    out: dict[tuple, float] = {}
    for text in texts:
        for name, labels, value in samples(text):
            if SUMMABLE.search(name):
                key = (name, tuple(sorted(labels.items())))
                out[key] = out.get(key, 0.0) + value
    return out


def bind(a, helpers: dict):
    """The Ray Serve application of the serve flags `a` (serve.run it): `deployment_options(a)`
    over Replica.  helpers: serve/launch.py build's (specdec.frontends.cli.serve_helpers())."""
    _, serve = require_ray()
    a = copy.copy(a)
    a.threads = a.threads or os.cpu_count() or 1       # a replica's threads are its num_cpus
    a.suffix_store = None                               # each replica reads -lcd itself
    return serve.deployment(**deployment_options(a))(serve.ingress()(Replica)).bind(a, helpers)


def deploy(a, *, load, draft_options, set_threads, log, quant=None) -> int:
    """`specdec serve --ray-replicas N`: deploy on a Ray cluster (a local one started for the
    purpose unless --ray-address or $RAY_ADDRESS names one), serve until Ctrl-C / SIGTERM, then
    delete the application (replicas drain) and leave; a cluster started here is shut down."""
    own = a.ray_address is None and not os.environ.get("RAY_ADDRESS")
    local = own and a.host in ("127.0.0.1", "localhost")
    if local:       # a one-machine Ray on loopback (read at `import ray`; else the outward address)
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    ray, serve = require_ray()
    check(a, draft_options)
    a.threads = a.threads or os.cpu_count() or 1
    ray.init(address=a.ray_address, include_dashboard=False,
             **({"_node_ip_address": "127.0.0.1"} if local else {}))
    try:
        cpus = ray.cluster_resources().get("CPU", 0)
        need = a.ray_replicas * a.threads
        if need > cpus:
            msg = (f"--ray-replicas {a.ray_replicas} x -t {a.threads} needs {need} CPUs; the Ray "
                   f"cluster has {cpus:g}")
            if own:
                raise ConfigError(msg)
            log(f"specdec: warning: {msg} (replicas wait for nodes)")
        serve.start(http_options={"host": a.host, "port": a.port})
        helpers = dict(load=load, draft_options=draft_options, set_threads=set_threads, log=log, quant=quant)
        try:
            serve.run(bind(a, helpers), name=APP_NAME, route_prefix="/")
        except Exception as e:                       # noqa: BLE001 - a replica failed to start
            last = [ln for ln in str(e).splitlines() if ln.strip()][-1:] or [type(e).__name__]
            raise ConfigError(f"the Ray Serve deployment failed: {last[0].strip()}") from None
        scale = (f"{a.ray_replicas}..{a.ray_max_replicas}" if a.ray_max_replicas else str(a.ray_replicas))
        url = f"http://{a.host}:{a.port}"
        log(f"specdec: serving on {url} (OpenAI API at {url}/v1) by {scale} Ray Serve replicas of "
            f"{a.parallel} slots and {a.threads} threads each")
        _wait_for_signal()
        log("specdec: stopping: the replicas drain")
    finally:
        leave = serve.shutdown if own else (lambda: serve.delete(APP_NAME))
        t = threading.Thread(target=leave, name="specdec-ray-leave", daemon=True)
        t.start()
        t.join(60)                  # bounded: a Ray whose processes a signal already ended hangs
        ray.shutdown()
    return 0


def _wait_for_signal() -> None:
    stop = threading.Event()
    old = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        while not stop.wait(1.0):
            pass
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)
