"""The OpenAI wire format of `specdec serve`: the request bodies (pydantic models; unknown
fields ignored, as OpenAI clients send many), the error body {"error": {"message", "type",
"param", "code"}} and the API-key check in front of every route (`BearerAuth`)."""
from __future__ import annotations

import hmac
from typing import Any, Literal, Optional, Union

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from ...speculation.policies import DRAFT_N_MAX
from .logprobs import MAX_TOP


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
    draft: Optional[Literal["model", "prompt-lookup", "hybrid", "suffix", "none"]] = None
    draft_n: Optional[int] = Field(None, ge=1, le=DRAFT_N_MAX)
    logprobs: Optional[Union[bool, int]] = None            # completions: N; chat: true
    top_logprobs: Optional[int] = Field(None, ge=0, le=MAX_TOP)   # chat's N
    n_probs: Optional[int] = Field(None, ge=0, le=MAX_TOP)        # llama-server's N
    post_sampling_probs: bool = False                      # llama-server: the sampler's p
    prediction: Optional[Union[Prediction, str]] = None    # predicted output (a bare string too)
    specdec: Optional[SpecdecOptions] = None               # opt-in extension data (tokenlog.py)


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


class ChatRequest(CommonRequest):
    messages: list[Message] = Field(min_length=1)


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
