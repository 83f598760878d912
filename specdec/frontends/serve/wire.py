"""The OpenAI wire format of `specdec serve`: the request bodies (pydantic models; unknown
fields ignored, as OpenAI clients send many), the response objects of one request (`Shape`:
the whole answer, the streamed chunks, usage and llama-server's `timings`), the error body
{"error": {"message", "type", "param", "code"}} and the API-key check in front of every route
(`BearerAuth`)."""
from __future__ import annotations

import hmac
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Optional, Union

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from ...api import tools
from ...speculation.drafters.prediction import SOURCE as PREDICTED
from ...speculation.policies import DRAFT_N_MAX
from .logprobs import MAX_TOP, chat_logprobs, completion_logprobs

if TYPE_CHECKING:
    from .scheduler import Job, JobResult

FINISH = {"eog": "stop", "stop": "stop", "n_predict": "length", "ctx_full": "length"}


class CommonRequest(BaseModel):
    """Fields both endpoints take; unknown fields are ignored (OpenAI clients send many)."""
    model_config = ConfigDict(extra="ignore")
    model: Optional[str] = None
    max_tokens: Optional[int] = Field(None, ge=1)
    max_completion_tokens: Optional[int] = Field(None, ge=1)
    n_predict: Optional[int] = Field(None, ge=-1)          # llama-server's name (-1: unlimited)
    temperature: Optional[float] = Field(None, ge=0.0)
    top_p: Optional[float] = Field(None, ge=0.0, le=1.0)
    top_k: Optional[int] = Field(None, ge=0)
    min_p: Optional[float] = Field(None, ge=0.0, le=1.0)
    seed: Optional[int] = Field(None, ge=-1)               # -1: a random seed, as llama-server
    stop: Optional[Union[str, list[str]]] = None
    stream: bool = False
    stream_options: Optional[dict[str, Any]] = None
    n: int = Field(1, ge=1, le=1)
    ignore_eos: bool = False
    draft: Optional[Literal["model", "prompt-lookup", "hybrid", "suffix", "mtp", "none"]] = None
    draft_n: Optional[int] = Field(None, ge=1, le=DRAFT_N_MAX)
    logprobs: Optional[Union[bool, int]] = None            # completions: N; chat: true
    top_logprobs: Optional[int] = Field(None, ge=0, le=MAX_TOP)   # chat's N
    n_probs: Optional[int] = Field(None, ge=0, le=MAX_TOP)        # llama-server's N
    post_sampling_probs: bool = False                      # llama-server: the sampler's p
    prediction: Optional[Union[Prediction, str]] = None    # predicted output (a bare string too)
    specdec: Optional[SpecdecOptions] = None               # opt-in extension data (tokenlog.py)
    response_format: Optional[dict[str, Any]] = None       # structured output (structured.py)
    json_schema: Optional[Union[dict[str, Any], bool, str]] = None   # llama-server's fields
    grammar: Optional[str] = None


class SpecdecOptions(BaseModel):
    """`specdec: {"tokens": true}`: each token's kind and each step's trace record (tokenlog.py)."""
    model_config = ConfigDict(extra="forbid")
    tokens: bool = False


class _Part(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: str = "text"
    text: str = ""


class Prediction(BaseModel):
    """OpenAI's predicted output: {"type": "content", "content": text or [text parts]}."""
    model_config = ConfigDict(extra="forbid")
    type: Literal["content"]
    content: Union[str, list[_Part]]

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(
            p.text for p in self.content if p.type == "text")


class CompletionRequest(CommonRequest):
    prompt: Union[str, list[int], list[str]]


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: Union[str, list[_Part], None] = None
    tool_calls: Optional[list[dict[str, Any]]] = None      # an assistant's earlier calls
    tool_call_id: Optional[str] = None                     # a tool message answers this call
    name: Optional[str] = None


class ChatRequest(CommonRequest):
    messages: list[Message] = Field(min_length=1)
    tools: Optional[list[Any]] = None                      # OpenAI's tools (api/tools.py checks them)
    tool_choice: Optional[Union[str, dict[str, Any]]] = None
    parallel_tool_calls: Optional[bool] = None


class ApiError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code
        self.headers = headers


def error_body(message: str, type_: str = "invalid_request_error", param=None, code=None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def error_response(e: ApiError) -> JSONResponse:
    return JSONResponse(error_body(e.message, e.type, e.param, e.code), status_code=e.status,
                        headers=e.headers)


class BearerAuth:
    """ASGI middleware: every route but /health (and the `public` ones: the chat page's files)
    requires `Authorization: Bearer KEY` with one of `keys` (each compared in constant time,
    all of them every time); else a 401 with OpenAI's error body."""

    def __init__(self, app, keys: tuple[str, ...], public=lambda path: False):
        self.app, self.keys, self.public = app, tuple(k.encode() for k in keys), public

    def authorized(self, header: bytes) -> bool:
        scheme, _, token = header.partition(b" ")
        ok = False
        for k in self.keys:
            ok |= hmac.compare_digest(token.strip(), k)
        return ok and scheme.lower() == b"bearer"

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"] != "/health" and not self.public(scope["path"]):
            header = dict(scope.get("headers") or ()).get(b"authorization", b"")
            if not self.authorized(header):
                msg = ("missing API key: send 'Authorization: Bearer KEY'" if not header else
                       "incorrect API key provided")
                response = error_response(ApiError(401, msg, code="invalid_api_key",
                                                    headers={"WWW-Authenticate": "Bearer"}))
                return await response(scope, receive, send)
        return await self.app(scope, receive, send)


def validation_error(errs) -> ApiError:
    first = errs[0] if errs else {}
    loc = [str(x) for x in first.get("loc", ()) if x != "body"]
    if first.get("type") == "json_invalid":
        return ApiError(400, "the request body is not valid JSON")
    param = ".".join(loc) or None
    return ApiError(400, f"{param or 'body'}: {first.get('msg', 'invalid')}", param=param)


# -- the response objects ----------------------------------------------------------------------

def usage(r: JobResult) -> dict:
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
class Shape:
    """The OpenAI response objects of one request: the whole answer (`full`) or its stream of
    chunks (`chunk`, `last_chunk`)."""
    id: str
    created: int
    model: str
    chat: bool
    job: Job
    tokenizer: Any = None
    n_streamed: int = 0                     # tokens whose logprobs went out in chunks
    parser: Any = None                      # api/tools.StreamParser: the answer may hold tool_calls
    pending_lps: list = field(default_factory=list)     # logprobs held back with the parser's text

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

    def chunks(self, text: str, lps=()) -> list[dict]:
        """The chunks of one text delta: one, or with tools one per content / tool-call delta
        (api/tools.StreamParser; none while a call is still being written)."""
        if self.parser is None:
            return [self.chunk(text, lps=lps)]
        out = [self._delta_chunk(d) for d in self.parser.feed(text)]
        if lps:                                 # the tokens' logprobs ride on the next chunk out
            self.pending_lps += list(lps)
        if out and self.pending_lps:
            out[0]["choices"][0]["logprobs"] = self.logprobs(self.pending_lps, self.n_streamed)
            self.n_streamed += len(self.pending_lps)
            self.pending_lps = []
        return out

    def _delta_chunk(self, delta: dict) -> dict:
        return {**self.head(), "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}]}

    def finish(self, r: JobResult, called: bool) -> str:
        """OpenAI's finish_reason: 'tool_calls' when the answer ended in calls."""
        f = FINISH.get(r.gen.stop_reason, "stop")
        return "tool_calls" if called and f == "stop" else f

    def last_chunks(self, r: JobResult, lps=()) -> list[dict]:
        """The chunks that end a stream: what the tool parser held back, then the last one."""
        out = []
        if self.parser is not None:
            out = [self._delta_chunk(d) for d in self.parser.flush()]
            lps = [*self.pending_lps, *lps]
            self.pending_lps = []
        called = self.parser is not None and bool(self.parser.calls)
        return [*out, {**self.chunk("", finish=self.finish(r, called), lps=lps),
                       "usage": usage(r), "timings": timings(r)}]

    def last_chunk(self, r: JobResult, lps=()) -> dict:
        return self.last_chunks(r, lps)[-1]

    def full(self, r: JobResult) -> dict:
        finish = FINISH.get(r.gen.stop_reason, "stop")
        if self.chat:
            message: dict = {"role": "assistant", "content": r.text}
            if self.parser is not None:
                content, calls = tools.parse(r.text, self.parser.make_id)
                if calls:
                    message = {"role": "assistant", "content": content,
                               "tool_calls": [c.openai() for c in calls]}
                    finish = self.finish(r, True)
            choice = {"index": 0, "message": message,
                      "logprobs": self.logprobs(r.logprobs or ()), "finish_reason": finish}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": r.text, "logprobs": self.logprobs(r.logprobs or ()),
                      "finish_reason": finish}
            obj = "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "choices": [choice], "usage": usage(r), "timings": timings(r)}
