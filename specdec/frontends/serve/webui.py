"""The chat page `specdec serve` answers at `/` (off with --no-webui): static HTML, CSS and
one script shipped in the package (specdec/frontends/serve/static/, read with
importlib.resources; no build step, nothing fetched from elsewhere).

The page is public, as `/health` is: it holds no key and no data.  It asks for the API key
when the server wants one (a 401 from /v1/models) and sends it as `Authorization: Bearer`
on its own requests.  Model output reaches the DOM as text only (textContent), and the
Content-Security-Policy below allows scripts from this origin alone, so an answer that
contains markup stays text.  The page asks for the stream's `specdec` extension
(tokenlog.py) to colour each token by how it was produced.
"""
from __future__ import annotations

from functools import lru_cache
from importlib import resources

from fastapi import FastAPI
from fastapi.responses import Response

PAGES = {"/": ("index.html", "text/html; charset=utf-8"),
         "/webui/app.js": ("app.js", "text/javascript; charset=utf-8"),
         "/webui/markdown.js": ("markdown.js", "text/javascript; charset=utf-8"),
         "/webui/style.css": ("style.css", "text/css; charset=utf-8"),
         "/favicon.ico": ("favicon.svg", "image/svg+xml")}
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
                               "img-src 'self'; connect-src 'self'; base-uri 'none'; "
                               "form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


@lru_cache(maxsize=None)
def asset(name: str) -> bytes:
    """A file of the page, from the installed package."""
    return resources.files("specdec.frontends.serve").joinpath("static", name).read_bytes()


def is_public(path: str) -> bool:
    """The page's own paths: served without an API key (they hold none)."""
    return path in PAGES


def add_webui(app: FastAPI) -> None:
    """GET / and the page's files."""
    def route(path: str, name: str, media: str) -> None:
        async def page() -> Response:
            return Response(asset(name), media_type=media, headers=HEADERS)
        app.get(path, include_in_schema=False)(page)

    for path, (name, media) in PAGES.items():
        route(path, name, media)
