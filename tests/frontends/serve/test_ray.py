"""`specdec serve` as a Ray Serve deployment (specdec/frontends/serve/ray.py) on a local Ray
cluster started here (`ray.init` on this machine, 2 CPUs, everything on 127.0.0.1): two replicas
of SmolLM2-135M with one thread each behind Ray's HTTP proxy, called with the `openai` client.

Checked: eight concurrent requests (chat and completions, greedy and seeded sampled) give the
answers of a plain `specdec serve` with the same flags, bit for bit, and both replicas served
(a replica takes at most -np = 4 at once); each replica's /metrics and their sum; a replica
killed while it streams is replaced, and the clients' retried requests succeed with the same
answers; the teardown (serve.shutdown, ray.shutdown) leaves no process of the cluster behind.
Skipped where Ray is not installed (pip install 'specdec[ray]')."""
from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from helpers import real_model_path
from servers import Server, free_port

# One machine, loopback only: Ray then gives its node the address 127.0.0.1 (on Linux it would
# take the host's outward address even with _node_ip_address="127.0.0.1").  Read at `import ray`.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
ray = pytest.importorskip("ray", reason="Ray is not installed: pip install 'specdec[ray]'")
serve = pytest.importorskip("ray.serve", reason="Ray Serve is not installed: pip install 'specdec[ray]'")

from specdec.frontends.cli import build_parser  # noqa: E402
from specdec.frontends.cli import serve_helpers  # noqa: E402
from specdec.frontends.serve.ray import APP_NAME, DEPLOYMENT, REPLICA_HEADER, bind, sum_metrics  # noqa: E402

pytestmark = [pytest.mark.real, pytest.mark.slow]

MODEL = "smollm2-135m-instruct-q4_1"
FLAGS = ["-np", "4", "-t", "1", "-c", "512"]
DEPLOY_TIMEOUT = 150             # seconds for the replicas to load (and a killed one to come back)
REQUESTS = [                     # (endpoint, body): greedy and seeded sampled, chat and completions
    ("chat", {"messages": [{"role": "user", "content": "Name three colours."}], "max_tokens": 24,
              "temperature": 0}),
    ("chat", {"messages": [{"role": "user", "content": "What is 2 + 2?"}], "max_tokens": 16,
              "temperature": 0}),
    ("completions", {"prompt": "The capital of France is", "max_tokens": 20, "temperature": 0}),
    ("completions", {"prompt": "def fibonacci(n):", "max_tokens": 32, "temperature": 0}),
    ("chat", {"messages": [{"role": "user", "content": "Write a haiku about rain."}], "max_tokens": 24,
              "temperature": 0.8, "seed": 7}),
    ("completions", {"prompt": "Once upon a time", "max_tokens": 24, "temperature": 0.9, "seed": 11}),
    ("chat", {"messages": [{"role": "system", "content": "Answer briefly."},
                           {"role": "user", "content": "Why is the sky blue?"}], "max_tokens": 28,
              "temperature": 0}),
    ("completions", {"prompt": "1, 2, 3, 4,", "max_tokens": 16, "temperature": 0.7, "seed": 3}),
]


def ask(client: openai.OpenAI, endpoint: str, body: dict) -> tuple[str, str | None]:
    """(the answer's text, the replica that served it)."""
    api = client.chat.completions if endpoint == "chat" else client.completions
    raw = api.with_raw_response.create(model=MODEL, **body)
    out = raw.parse()
    text = out.choices[0].message.content if endpoint == "chat" else out.choices[0].text
    return text, raw.headers.get(REPLICA_HEADER)


def ask_stream(client: openai.OpenAI, endpoint: str, body: dict, started: threading.Event | None = None) -> str:
    """The streamed answer's text; `started` is set at the first content chunk."""
    api = client.chat.completions if endpoint == "chat" else client.completions
    parts = []
    for chunk in api.create(model=MODEL, stream=True, **body):
        if not chunk.choices:
            continue
        c = chunk.choices[0]
        piece = (c.delta.content or "") if endpoint == "chat" else (c.text or "")
        if piece and started is not None:
            started.set()
        parts.append(piece)
    return "".join(parts)


def descendants(pid: int) -> set[int]:
    """Every process below pid (from /proc)."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d))
    out, todo = set(), [pid]
    while todo:
        for c in children.get(todo.pop(), ()):
            if c not in out:
                out.add(c)
                todo.append(c)
    return out


def alive(pids: set[int]) -> set[int]:
    """Those of pids that still run (zombies, waiting for their parent, do not)."""
    out = set()
    for p in pids:
        try:
            with open(f"/proc/{p}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                    out.add(p)
        except OSError:
            pass
    return out


def replica_states() -> dict[str, int]:
    status = serve.status().applications[APP_NAME].deployments[DEPLOYMENT]
    return {str(k): v for k, v in status.replica_states.items()}


def wait_for(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s: {what}")
        time.sleep(0.5)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The answers of a plain `specdec serve` with the same flags, one request at a time."""
    path = real_model_path(MODEL)
    s = Server(["-m", str(path), *FLAGS], tmp_path_factory.mktemp("plain") / "server.log")
    try:
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="none", timeout=120, max_retries=0)
        return [ask(client, ep, body)[0] for ep, body in REQUESTS]
    finally:
        s.stop()


class Cluster:
    """A local Ray cluster (loopback only, 2 CPUs, no dashboard) serving two replicas."""

    def __init__(self):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.before = descendants(os.getpid())
        self.pids: set[int] = set()
        self.metrics_port = free_port()             # the node's Prometheus export (Ray's metrics)
        ctx = ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1",
                       _metrics_export_port=self.metrics_port, namespace="specdec-test",
                       log_to_driver=False)        # the replicas' logs stay in the session folder
        self.session_dir = ctx.address_info.get("session_dir")
        serve.start(http_options={"host": "127.0.0.1", "port": self.port})
        a = build_parser().parse_args(["serve", "-m", str(real_model_path(MODEL)), *FLAGS,
                                       "--ray-replicas", "2", "--port", str(self.port)])
        done: list = []
        t = threading.Thread(target=lambda: done.append(serve.run(bind(a, serve_helpers()), name=APP_NAME,
                                                                  route_prefix="/")),
                             daemon=True)
        t.start()
        t.join(DEPLOY_TIMEOUT)
        assert done, f"the deployment did not start within {DEPLOY_TIMEOUT} s: {serve.status()}"
        self.client = openai.OpenAI(base_url=self.url + "/v1", api_key="none", timeout=120, max_retries=0)

    def close(self) -> set[int]:
        """serve.shutdown(), ray.shutdown(); the cluster's processes that still run after 30 s."""
        self.pids |= descendants(os.getpid()) - self.before
        try:
            serve.shutdown()
        finally:
            ray.shutdown()
        deadline = time.monotonic() + 30
        while alive(self.pids) and time.monotonic() < deadline:
            time.sleep(0.5)
        return alive(self.pids)


@pytest.fixture(scope="module")
def cluster(reference):
    c = Cluster()
    yield c
    if ray.is_initialized():
        c.close()


def test_replicas_answer_as_a_plain_server(cluster, reference):
    """Eight concurrent requests through Ray's proxy: the plain server's answers, both replicas."""
    with ThreadPoolExecutor(len(REQUESTS)) as ex:
        got = list(ex.map(lambda r: ask(cluster.client, *r), REQUESTS))
    for (text, replica), want, (ep, body) in zip(got, reference, REQUESTS):
        assert text == want, (ep, body)
        assert replica
    assert len({replica for _, replica in got}) == 2, "both replicas serve (at most 4 requests each)"
    assert len(replica_states()) >= 1


def test_metrics_per_replica_and_their_sum(cluster):
    """/metrics answers for one replica (named in the header); their sum counts every request."""
    texts: dict[str, str] = {}
    for _ in range(60):
        r = httpx.get(cluster.url + "/metrics", timeout=30)
        assert r.status_code == 200
        texts[r.headers[REPLICA_HEADER]] = r.text
        if len(texts) == 2:
            break
    assert len(texts) == 2, "both replicas' /metrics reached through the proxy"
    total = sum_metrics(list(texts.values()))
    assert total[("specdec_requests_total", (("status", "ok"),))] == len(REQUESTS)
    assert total[("specdec_slots_total", ())] == 8
    assert httpx.get(cluster.url + "/health", timeout=30).json()["slots_total"] == 4
    # each replica copies its figures into Ray's metrics: the node exports them per replica
    want = 'ray_specdec_requests_total{'

    def exported() -> dict[str, float]:
        try:
            text = httpx.get(f"http://127.0.0.1:{cluster.metrics_port}/metrics", timeout=10).text
        except httpx.HTTPError:
            return {}
        return {ln.split("replica=")[1].split('"')[1]: float(ln.rsplit(" ", 1)[1])
                for ln in text.splitlines() if ln.startswith(want) and 'status="ok"' in ln}
    wait_for(lambda: sum(exported().values()) == len(REQUESTS), 60, "Ray's metrics export")
    assert set(exported()) == set(texts)


def test_a_killed_replica_is_replaced_and_retries_succeed(cluster, reference):
    """Kill one replica while all eight requests stream; each client retries until it gets its
    answer (the plain server's); a new replica takes the dead one's place and serves too."""
    started = [threading.Event() for _ in REQUESTS]
    failures: list[str] = []

    def client(i: int) -> str:
        ep, body = REQUESTS[i]
        for attempt in range(8):
            try:
                return ask_stream(cluster.client, ep, body, started[i] if attempt == 0 else None)
            except (openai.APIError, httpx.HTTPError) as e:
                failures.append(f"request {i}, attempt {attempt}: {type(e).__name__}")
                started[i].set()
                time.sleep(1.0)
        raise AssertionError(f"request {i} failed 8 times")

    before = set(replica_states())
    named = [x for x in ray.util.list_named_actors(all_namespaces=True)
             if x["namespace"] == "serve" and DEPLOYMENT in x["name"] and "REPLICA" in x["name"]]
    assert len(named) == 2, named
    with ThreadPoolExecutor(len(REQUESTS)) as ex:
        futures = [ex.submit(client, i) for i in range(len(REQUESTS))]
        for e in started:
            assert e.wait(DEPLOY_TIMEOUT), "the streams did not start"
        victim = named[0]
        ray.kill(ray.get_actor(victim["name"], namespace="serve"), no_restart=True)
        answers = [f.result(timeout=DEPLOY_TIMEOUT) for f in futures]
    assert answers == reference
    assert failures, "the killed replica's requests failed and were retried"
    wait_for(lambda: len(named_replicas()) == 2 and victim["name"] not in named_replicas(),
             DEPLOY_TIMEOUT, "a new replica replaces the killed one")
    wait_for(lambda: list(replica_states().values()) == [2] or replica_states().get("RUNNING") == 2,
             DEPLOY_TIMEOUT, f"two running replicas (was {before})")
    with ThreadPoolExecutor(len(REQUESTS)) as ex:
        got = list(ex.map(lambda r: ask(cluster.client, *r), REQUESTS))
    assert [t for t, _ in got] == reference
    assert len({r for _, r in got}) == 2


def named_replicas() -> set[str]:
    return {x["name"] for x in ray.util.list_named_actors(all_namespaces=True)
            if x["namespace"] == "serve" and DEPLOYMENT in x["name"] and "REPLICA" in x["name"]}


def test_teardown_leaves_no_process(cluster):
    """serve.shutdown() and ray.shutdown() end every process the cluster started."""
    left = cluster.close()
    assert not ray.is_initialized()
    assert not left, f"processes left behind: {sorted(left)}"
