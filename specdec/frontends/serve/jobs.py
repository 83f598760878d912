"""From an HTTP request to the scheduler's `Job`: the server's per-request defaults
(`ServeConfig`), the body read within its bounds (over --max-body: 413; slower than
--body-timeout: 408) and parsed into its wire model, and the fields checked and mapped onto a
Job (model, prompt, sampling, drafting, limits, logprobs), an ApiError naming the field
otherwise."""
from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from pydantic import BaseModel, ValidationError

from ...api.drafting import DraftPlan
from ...generation.sampling import SamplerParams
from ...speculation.drafters import has_mtp
from .logprobs import MAX_TOP
from .scheduler import Job, Scheduler
from .wire import ApiError, CommonRequest, validation_error


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


async def read_body(request: Request, limit: int) -> bytes:
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


async def parse(request: Request, cls: type[BaseModel], config: ServeConfig) -> BaseModel:
    """The JSON body as a cls (whatever the Content-Type, as llama-server: `curl -d` works);
    a body over config.max_body is a 413, one slower than config.body_timeout a 408 (the
    connection closed; no slot was taken)."""
    try:
        raw = await asyncio.wait_for(read_body(request, config.max_body), config.body_timeout)
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


def make_job(scheduler: Scheduler, config: ServeConfig, body: CommonRequest, ids: list[int],
             chat: bool, constraint=None) -> Job:
    """The scheduler's Job of a request body: its model, prompt, sampling, drafting and limits
    checked (an ApiError naming the field otherwise); constraint: the ConstraintSpec its
    output follows (structured.py, checked already)."""
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
    kind = None if body.draft in (None, "none") else body.draft
    own = has_mtp(scheduler.model)                      # the target's MTP head drafts in a model's place
    if (kind == "model" or (kind == "hybrid" and not own)) and config.draft_model is None:
        raise ApiError(400, f"draft {kind!r} needs a draft model: start the server with -md",
                       param="draft")
    if kind == "mtp" and not own:
        raise ApiError(400, "draft 'mtp' needs a model with an MTP head (nextn tensors)", param="draft")
    draft = DraftPlan.for_request(scheduler.draft, body.draft, body.draft_n, config.draft_model)
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
    seed = config.seed if body.seed is None else (None if body.seed == -1 else body.seed)
    return Job(ids, n, params, draft, prediction=prediction, seed=seed, constraint=constraint,
               stop=stop, ignore_eos=body.ignore_eos, stream=body.stream,
               logprobs=n_top(body, chat),
               post_sampling=body.post_sampling_probs,
               tokens=bool(body.specdec and body.specdec.tokens))


def n_top(body: CommonRequest, chat: bool) -> int | None:
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
