"""The HTTP face of `specdec serve`: FastAPI routes in the OpenAI wire format over a
`Scheduler` (the request bodies and error bodies: wire.py).

    GET  /health                 {"status": "ok"}
    GET  /v1/models              the served model (its ids)
    POST /v1/completions         prompt -> text           (stream: server-sent events)
    POST /v1/chat/completions    messages -> message      (the model's chat template)
    GET  /metrics                Prometheus text (metrics.py)
    GET  /                       the chat page (webui.py; --no-webui: off)

Every error is {"error": {"message", "type", "param", "code"}} with a 4xx status (bad input:
400, unknown model or route: 404, a full queue or a draining server: 503 with Retry-After);
never a traceback.  A streamed request whose client goes away is cancelled, which frees its
slot at the scheduler's next step.  Besides OpenAI's fields, each response carries llama-
server's `timings` (prompt / predicted counts, ms and tokens per second, draft_n,
draft_n_accepted) and the request may set `draft` ('model', 'prompt-lookup', 'hybrid',
'suffix', 'none'), `draft_n`, `top_k`, `min_p`, `ignore_eos`.  OpenAI's predicted outputs:
`prediction` {"type": "content", "content": text or text parts} is drafted first wherever the
answer follows it (drafters.PredictionDrafter), and usage.completion_tokens_details counts
its accepted_prediction_tokens / rejected_prediction_tokens.
"""
from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass, replace
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from ...errors import SpecdecError
from ...speculation.drafters.prediction import SOURCE as PREDICTED
from ...generation.sampling import SamplerParams

from .logprobs import MAX_TOP, chat_logprobs, completion_logprobs
from .scheduler import Cancelled, Job, JobResult, QueueFull, Scheduler, ShuttingDown
from .tokenlog import ExtBuffer, whole
from .webui import add_webui, is_public
from .wire import (ApiError, BearerAuth, ChatRequest, CommonRequest, CompletionRequest, error_body,
                   error_response, validation_error)

RETRY_AFTER_S = 1
DRAIN_GRACE_S = 5       # after the drain deadline's 503s, uvicorn's own shutdown deadline
FINISH = {"eog": "stop", "stop": "stop", "n_predict": "length", "ctx_full": "length"}




# -- the app ---------------------------------------------------------------------------------

@dataclass
class ServeConfig:
    """What the server serves and its per-request defaults (the command line's)."""
    model_ids: tuple[str, ...]               # names a request's `model` may use; [0] is reported
    params: SamplerParams = SamplerParams(temperature=0.0)
    n_predict: int = -1
    seed: int | None = None
    draft_model: Any = None                  # the -md Model, for per-request draft='model'
    api_keys: tuple[str, ...] = ()           # Bearer keys /v1/* and /metrics require (none: open)
    max_body: int = 8 << 20                  # bytes; a larger body is a 413
    max_tokens_limit: int | None = None      # most tokens a request may ask for (None: the slot)
    body_timeout: float = 30.0               # seconds to receive a body; slower is a 408
    webui: bool = True                       # the chat page at / (webui.py; --no-webui: off)


def _add_error_handlers(app: FastAPI) -> None:
    """Every error as OpenAI's error body with its 4xx / 5xx status, never a traceback."""
    @app.exception_handler(ApiError)
    async def _api_error(request, e: ApiError):
        return error_response(e)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request, e: RequestValidationError):
        return error_response(validation_error(e.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request, e: StarletteHTTPException):
        type_ = "not_found_error" if e.status_code == 404 else "invalid_request_error"
        return error_response(ApiError(e.status_code, str(e.detail), type_))

    @app.exception_handler(SpecdecError)
    async def _specdec(request, e: SpecdecError):
        return error_response(ApiError(400, str(e)))

    @app.exception_handler(Exception)
    async def _internal(request, e: Exception):
        return error_response(ApiError(500, f"internal error: {type(e).__name__}", "server_error"))


def create_app(scheduler: Scheduler, config: ServeConfig) -> FastAPI:
    """The FastAPI app over a running scheduler (closed, draining, at the app's shutdown)."""
    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def lifespan(app):
        yield
        await asyncio.to_thread(scheduler.close)

    app = FastAPI(title="specdec serve", lifespan=lifespan, docs_url=None, redoc_url=None)
    if config.api_keys:
        app.add_middleware(BearerAuth, keys=config.api_keys,
                           public=is_public if config.webui else (lambda path: False))
    if config.webui:
        add_webui(app)
    model = scheduler.model
    created = int(time.time())

    _add_error_handlers(app)

    @app.get("/health")
    async def health():
        return {"status": "ok", "slots_idle": len(scheduler.free), "slots_total": scheduler.n_parallel}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [
            {"id": config.model_ids[0], "object": "model", "created": created, "owned_by": "specdec",
             "meta": {"arch": model.config.arch, "n_vocab": model.config.n_vocab,
                      "n_ctx_train": model.config.n_ctx_train, "n_ctx_slot": scheduler.n_ctx,
                      "n_parallel": scheduler.n_parallel, "aliases": list(config.model_ids)}}]}

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(scheduler.metrics.render(
            scheduler.gauges(), {"model": scheduler.caps.table, "prompt-lookup": scheduler.caps.lookup}),
                                 media_type="text/plain; version=0.0.4")

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await _parse(request, CompletionRequest, config)
        p = body.prompt
        if isinstance(p, list) and p and isinstance(p[0], str):
            if len(p) != 1:
                raise ApiError(400, "prompt: one prompt per request", param="prompt")
            p = p[0]
        ids = model.tokenize(p) if isinstance(p, str) else [int(t) for t in p]
        if any(not 0 <= t < model.config.n_vocab for t in ids):
            raise ApiError(400, f"prompt: token ids must be in 0..{model.config.n_vocab - 1}", param="prompt")
        return await _serve(scheduler, config, body, ids, request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await _parse(request, ChatRequest, config)
        msgs = [{"role": "system" if m.role == "developer" else m.role,
                 "content": m.content if isinstance(m.content, str) else
                 "".join(x.text for x in m.content or [] if x.type == "text")} for m in body.messages]
        ids = model.tokenize(model.chat_prompt(msgs))
        return await _serve(scheduler, config, body, ids, request, chat=True)

    return app


def _job(scheduler: Scheduler, config: ServeConfig, body: CommonRequest, ids: list[int], chat: bool) -> Job:
    """The scheduler's Job of a request body: its model, prompt, sampling, drafting and limits
    checked (an ApiError naming the field otherwise)."""
    if body.model is not None and body.model not in config.model_ids:
        raise ApiError(404, f"the model {body.model!r} does not exist; this server serves "
                            f"{config.model_ids[0]!r}", param="model", code="model_not_found")
    if not ids:
        raise ApiError(400, "the prompt is empty", param="prompt")
    if len(ids) + 1 > scheduler.n_ctx:
        raise ApiError(400, f"the prompt has {len(ids)} tokens; this server's context is "
                            f"{scheduler.n_ctx} (--ctx-size) per request", param="prompt",
                       code="context_length_exceeded")
    d = config.params
    params = SamplerParams(
        temperature=d.temperature if body.temperature is None else body.temperature,
        top_k=d.top_k if body.top_k is None else body.top_k,
        top_p=d.top_p if body.top_p is None else body.top_p,
        min_p=d.min_p if body.min_p is None else body.min_p)
    draft = scheduler.draft
    if body.draft is not None:
        kind = None if body.draft == "none" else body.draft
        if kind in ("model", "hybrid") and config.draft_model is None:
            raise ApiError(400, f"draft {kind!r} needs a draft model: start the server with -md",
                           param="draft")
        # "none": plain decoding (kind None with a draft model would mean the defaults)
        draft = (replace(draft, kind=None, model=None, drafter=None, suffix_store=None)
                 if kind is None else replace(draft, kind=kind, model=config.draft_model, drafter=None))
    if body.draft_n is not None:
        draft = replace(draft, n=body.draft_n)
    n = next((x for x in (body.max_tokens, body.max_completion_tokens, body.n_predict)
              if x is not None), config.n_predict)
    limit = config.max_tokens_limit
    if limit is not None and (n > limit or n == -1):
        if n == config.n_predict:                       # the server's own default: capped
            n = limit
        else:
            raise ApiError(400, f"max_tokens: at most {limit} on this server (--max-tokens-limit), "
                                f"got {n}", param="max_tokens")
    stop = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
    pred = body.prediction
    prediction = None if pred is None else (pred if isinstance(pred, str) else pred.text())
    return Job(ids, n, params, draft, prediction=prediction, seed=config.seed if body.seed is None else (None if body.seed == -1 else body.seed),
               stop=stop, ignore_eos=body.ignore_eos, stream=body.stream,
               logprobs=_n_top(body, chat),
               post_sampling=body.post_sampling_probs,
               tokens=bool(body.specdec and body.specdec.tokens))

async def _serve(scheduler: Scheduler, config: ServeConfig, body: CommonRequest, ids: list[int],
                 request: Request, chat: bool):
    """Submit the request's job and answer: a stream of chunks, or the whole response once done
    (cancelled when the client goes away)."""
    job = _job(scheduler, config, body, ids, chat)
    model = scheduler.model
    loop = asyncio.get_running_loop()
    events: asyncio.Queue = asyncio.Queue()
    job.on_event = lambda kind, value: loop.call_soon_threadsafe(events.put_nowait, (kind, value))
    try:
        scheduler.submit(job)
    except (QueueFull, ShuttingDown) as e:
        raise ApiError(503, str(e), "server_error", code="unavailable",
                       headers={"Retry-After": str(RETRY_AFTER_S)}) from None
    rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
    shape = _Shape(rid, int(time.time()), config.model_ids[0], chat, job, model.tokenizer)
    if body.stream:
        usage_chunk = bool((body.stream_options or {}).get("include_usage"))
        return StreamingResponse(_sse(job, events, shape, usage_chunk),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    try:
        while True:
            try:
                kind, value = await asyncio.wait_for(events.get(), 0.25)
            except asyncio.TimeoutError:
                if await request.is_disconnected():
                    job.cancel()
                    return JSONResponse(error_body("client disconnected"), status_code=499)
                continue
            if kind == "done":
                return whole(job, shape.full(value))
            if kind == "error":
                raise _as_api_error(value)
    finally:
        if not job.finished.is_set():
            job.cancel()


def _n_top(body: CommonRequest, chat: bool) -> int | None:
    """Alternatives per token the request asks for (None: no logprobs): completions'
    `logprobs: N`, chat's `logprobs: true` with `top_logprobs: N`, or llama-server's `n_probs`."""
    lp = body.logprobs
    if body.n_probs:
        return body.n_probs
    if chat:
        return (body.top_logprobs or 0) if lp else None
    if lp is None or lp is False:
        return None
    n = 0 if lp is True else int(lp)
    if not 0 <= n <= MAX_TOP:
        raise ApiError(400, f"logprobs: must be in 0..{MAX_TOP}, got {n}", param="logprobs")
    return n


async def _read_body(request: Request, limit: int) -> bytes:
    """The body, or a 413 as soon as it passes `limit` bytes (Content-Length or counted)."""
    size = request.headers.get("content-length", "")
    too_big = ApiError(413, f"the request body is over {limit} bytes (--max-body)",
                       code="request_too_large", headers={"Connection": "close"})
    if size.isdigit() and int(size) > limit:
        raise too_big
    chunks, n = [], 0
    async for chunk in request.stream():
        n += len(chunk)
        if n > limit:
            raise too_big
        chunks.append(chunk)
    return b"".join(chunks)


async def _parse(request: Request, cls: type[BaseModel], config: ServeConfig) -> BaseModel:
    """The JSON body as a cls (whatever the Content-Type, as llama-server: `curl -d` works);
    a body over config.max_body is a 413, one slower than config.body_timeout a 408 (the
    connection closed; no slot was taken)."""
    try:
        raw = await asyncio.wait_for(_read_body(request, config.max_body), config.body_timeout)
    except asyncio.TimeoutError:
        raise ApiError(408, f"the request body did not arrive within {config.body_timeout:g} s "
                            f"(--body-timeout)", code="timeout", headers={"Connection": "close"}) from None
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise ApiError(400, "the request body is not valid JSON") from None
    if not isinstance(data, dict):
        raise ApiError(400, "the request body must be a JSON object")
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        raise validation_error(e.errors()) from None


def _as_api_error(e: Exception) -> ApiError:
    if isinstance(e, Cancelled):
        return ApiError(503, str(e), "server_error", code="cancelled",
                        headers={"Retry-After": str(RETRY_AFTER_S)})
    if isinstance(e, SpecdecError):
        return ApiError(400, str(e))
    return ApiError(500, f"internal error: {type(e).__name__}", "server_error")


async def _sse(job: Job, events: asyncio.Queue, shape: "_Shape", usage_chunk: bool):
    """The server-sent events of a streamed request; cancels the job if the client leaves."""
    def data(obj) -> str:
        return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"
    pending: list = []                      # logprobs of the tokens behind the next delta
    ext = ExtBuffer()                       # the `specdec` extension (tokenlog.py), if asked
    try:
        if shape.chat:
            yield data(shape.chunk("", role=True))
        while True:
            kind, value = await events.get()
            if kind == "logprobs":
                pending += value
            elif kind == "specdec":
                ext.add(value)
            elif kind == "text":
                yield data(ext.attach(shape.chunk(value, lps=pending)))
                pending = []
            elif kind == "done":
                yield data(ext.attach(shape.last_chunk(value, pending), last=True))
                if usage_chunk:
                    yield data({**shape.head(), "choices": [], "usage": _usage(value)})
                break
            else:
                e = _as_api_error(value)
                yield data(error_body(e.message, e.type, e.param, e.code))
                break
        yield "data: [DONE]\n\n"
    finally:
        if not job.finished.is_set():
            job.cancel()


def _usage(r: JobResult) -> dict:
    """OpenAI's usage; completion_tokens_details counts the predicted-output tokens as
    OpenAI does: drafted from the prediction and accepted, or drafted and not accepted."""
    s = r.gen.stats
    pred = s.by_drafter.get(PREDICTED) if s is not None and s.by_drafter else None
    accepted = pred.n_accepted if pred else 0
    return {"prompt_tokens": r.gen.n_prompt, "completion_tokens": len(r.ids),
            "total_tokens": r.gen.n_prompt + len(r.ids),
            "completion_tokens_details": {"accepted_prediction_tokens": accepted,
                                          "rejected_prediction_tokens": (pred.n_drafted - accepted) if pred else 0}}


def timings(r: JobResult) -> dict:
    """llama-server's per-response `timings`, plus queue_ms and the draft figures."""
    t, s = r.gen.timings, r.gen.stats
    n = len(r.ids)
    out = {"prompt_n": r.gen.n_prompt, "prompt_ms": t.prompt_s * 1e3,
           "prompt_per_second": r.gen.n_prompt / t.prompt_s if t.prompt_s > 0 else 0.0,
           "predicted_n": n, "predicted_ms": t.decode_s * 1e3,
           "predicted_per_token_ms": t.decode_s * 1e3 / n if n else 0.0,
           "predicted_per_second": t.tokens_per_s, "queue_ms": r.queue_s * 1e3,
           "draft_n": s.n_drafted if s else 0, "draft_n_accepted": s.n_accepted if s else 0}
    if s is not None:
        out.update(draft_steps=s.n_steps, draft_acceptance=s.acceptance_rate,
                   tokens_per_step=s.tokens_per_step)
    return out


@dataclass
class _Shape:
    """The OpenAI response objects of one request."""
    id: str
    created: int
    model: str
    chat: bool
    job: Job
    tokenizer: Any = None
    n_streamed: int = 0                     # tokens whose logprobs went out in chunks

    def logprobs(self, lps, first: int = 0) -> dict | None:
        """The `logprobs` object of a choice over lps, the tokens first.. of the answer."""
        if self.job.logprobs is None:
            return None
        if self.chat:
            return chat_logprobs(self.tokenizer, list(lps))
        return completion_logprobs(self.tokenizer, list(lps),
                                   self.job.text_offsets[first: first + len(lps)])

    def head(self) -> dict:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def chunk(self, text: str, role: bool = False, finish: str | None = None, lps=()) -> dict:
        lp = self.logprobs(lps, self.n_streamed) if lps else None
        self.n_streamed += len(lps)
        if self.chat:
            delta = {"role": "assistant", "content": text} if role else ({"content": text} if text else {})
            choice = {"index": 0, "delta": delta, "logprobs": lp, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text, "logprobs": lp, "finish_reason": finish}
        return {**self.head(), "choices": [choice]}

    def last_chunk(self, r: JobResult, lps=()) -> dict:
        return {**self.chunk("", finish=FINISH.get(r.gen.stop_reason, "stop"), lps=lps),
                "usage": _usage(r), "timings": timings(r)}

    def full(self, r: JobResult) -> dict:
        finish = FINISH.get(r.gen.stop_reason, "stop")
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": r.text},
                      "logprobs": self.logprobs(r.logprobs or ()), "finish_reason": finish}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": r.text, "logprobs": self.logprobs(r.logprobs or ()),
                      "finish_reason": finish}
            obj = "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "choices": [choice], "usage": _usage(r), "timings": timings(r)}


def run_server(app: FastAPI, host: str, port: int, log=print, scheduler: Scheduler | None = None,
               drain_s: float = 30.0) -> int:
    """Serve until Ctrl-C / SIGTERM, then drain (uvicorn waits for open requests, the app's
    shutdown for the scheduler) and return 0.

    scheduler: one made with start=False, stepped here in the calling (main) thread while
    uvicorn serves from a thread of its own (Scheduler's docstring says why); the signals
    are caught here and handed to uvicorn.  drain_s: the running requests get this long to
    finish; then the scheduler cancels them, and each gets a 503 with OpenAI's error body and
    Retry-After (uvicorn, given a few seconds more, would otherwise drop them with a bare 500)."""
    import signal
    import threading

    import uvicorn

    class _Server(uvicorn.Server):
        async def startup(self, sockets=None):
            await super().startup(sockets)
            if self.started:
                log(f"specdec: serving on http://{host}:{port} (OpenAI API at http://{host}:{port}/v1)")

        def handle_exit(self, sig, frame):
            super().handle_exit(sig, frame)
            self._captured_signals.clear()          # a drained shutdown is a clean exit

    server = _Server(uvicorn.Config(app, host=host, port=port, log_level="warning",
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
