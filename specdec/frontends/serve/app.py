"""The HTTP face of `specdec serve`: FastAPI routes in the OpenAI wire format over a
`Scheduler`, and the answer to each request, whole or streamed (the request bodies, response
objects and error bodies: wire.py; a request's Job: jobs.py; serving and draining: lifecycle.py).

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

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ...errors import SpecdecError

from ...api import tools
from .jobs import ServeConfig, make_job, parse
from .structured import Structured, structured
from .scheduler import Cancelled, Job, QueueFull, Scheduler, ShuttingDown
from .tokenlog import ExtBuffer, whole
from .webui import add_webui, is_public
from .wire import (ApiError, BearerAuth, ChatRequest, CommonRequest, CompletionRequest, Shape, error_body,
                   error_response, usage, validation_error)

RETRY_AFTER_S = 1
POLL_S = 0.25           # how often a waiting request looks for its client gone or its job cancelled


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
        body = await parse(request, CompletionRequest, config)
        p = body.prompt
        if isinstance(p, list) and p and isinstance(p[0], str):
            if len(p) != 1:
                raise ApiError(400, "prompt: one prompt per request", param="prompt")
            p = p[0]
        ids = model.tokenize(p) if isinstance(p, str) else [int(t) for t in p]
        if any(not 0 <= t < model.config.n_vocab for t in ids):
            raise ApiError(400, f"prompt: token ids must be in 0..{model.config.n_vocab - 1}", param="prompt")
        return await _serve(scheduler, config, body, ids, request, chat=False,
                            want=structured(body, chat=False))

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await parse(request, ChatRequest, config)
        want = structured(body, chat=True)
        msgs = [_message(m) for m in body.messages]
        try:
            text = tools.chat_prompt(model.tokenizer, msgs, want.tools, want.choice)
        except tools.ToolError as e:
            raise ApiError(400, str(e), param=e.field) from None
        return await _serve(scheduler, config, body, model.tokenize(text), request, chat=True, want=want)

    return app


def _message(m) -> dict:
    """A wire Message as the chat template takes it (developer: system; text parts joined)."""
    out = {"role": "system" if m.role == "developer" else m.role,
           "content": m.content if isinstance(m.content, str) or m.content is None else
           "".join(x.text for x in m.content if x.type == "text")}
    if m.tool_calls:
        out["tool_calls"] = m.tool_calls
    for key in ("tool_call_id", "name"):
        if getattr(m, key) is not None:
            out[key] = getattr(m, key)
    return out



async def _serve(scheduler: Scheduler, config: ServeConfig, body: CommonRequest, ids: list[int],
                 request: Request, chat: bool, want: Structured = Structured()):
    """Submit the request's job and answer: a stream of chunks, or the whole response once done
    (cancelled when the client goes away).  want: its constraint and tools (structured.py)."""
    job = make_job(scheduler, config, body, ids, chat, constraint=want.constraint)
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
    shape = Shape(rid, int(time.time()), config.model_ids[0], chat, job, model.tokenizer,
                  parser=tools.StreamParser() if chat and want.parses_tools else None)
    if body.stream:
        usage_chunk = bool((body.stream_options or {}).get("include_usage"))
        return StreamingResponse(_sse(job, events, shape, usage_chunk),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    try:
        while True:
            kind, value = await _next_event(job, events)
            if kind is None:
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



async def _next_event(job: Job, events: asyncio.Queue) -> tuple:
    """The job's next event, (None, None) after POLL_S without one, or at once ('error',
    Cancelled) when the server has cancelled the job (the drain deadline, Scheduler.cancel_all):
    its 503 goes out now, not when the scheduler's current step ends and it acknowledges the
    cancel.  A step can outlast uvicorn's own shutdown deadline (DRAIN_GRACE_S later) on a
    loaded host, and uvicorn then cancels the request and answers a bare text 500."""
    if not job.cancelled.is_set():
        try:
            return await asyncio.wait_for(events.get(), POLL_S)
        except asyncio.TimeoutError:
            if not job.cancelled.is_set():
                return None, None
    if not events.empty():                      # what the scheduler sent first (its own answer)
        return events.get_nowait()
    return "error", Cancelled(job.cancel_reason or "the request was cancelled")


def _as_api_error(e: Exception) -> ApiError:
    if isinstance(e, Cancelled):
        return ApiError(503, str(e), "server_error", code="cancelled",
                        headers={"Retry-After": str(RETRY_AFTER_S)})
    if isinstance(e, SpecdecError):
        return ApiError(400, str(e))
    return ApiError(500, f"internal error: {type(e).__name__}", "server_error")


async def _sse(job: Job, events: asyncio.Queue, shape: Shape, usage_chunk: bool):
    """The server-sent events of a streamed request; cancels the job if the client leaves."""
    def data(obj) -> str:
        return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"
    pending: list = []                      # logprobs of the tokens behind the next delta
    ext = ExtBuffer()                       # the `specdec` extension (tokenlog.py), if asked
    try:
        if shape.chat:
            yield data(shape.chunk("", role=True))
        while True:
            kind, value = await _next_event(job, events)
            if kind is None:
                continue
            if kind == "logprobs":
                pending += value
            elif kind == "specdec":
                ext.add(value)
            elif kind == "text":
                for i, chunk in enumerate(shape.chunks(value, lps=pending)):
                    yield data(ext.attach(chunk) if i == 0 else chunk)
                pending = []
            elif kind == "done":
                *held, last = shape.last_chunks(value, pending)
                for chunk in held:
                    yield data(chunk)
                yield data(ext.attach(last, last=True))
                if usage_chunk:
                    yield data({**shape.head(), "choices": [], "usage": usage(value)})
                break
            else:
                e = _as_api_error(value)
                yield data(error_body(e.message, e.type, e.param, e.code))
                break
        yield "data: [DONE]\n\n"
    finally:
        if not job.finished.is_set():
            job.cancel()

