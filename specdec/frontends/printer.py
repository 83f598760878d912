"""Streams generated tokens to a terminal: whole UTF-8 characters only, optionally coloured
by how speculation produced them (accepted draft token, target correction, bonus token)."""
from __future__ import annotations

from typing import IO


class TokenPrinter:
    """on_token callback: printer(token_id, kind) writes the token's text as soon as it is whole."""

    def __init__(self, tokenizer, out: IO[str], colors: dict[str, str] | None = None, reset: str = ""):
        from ..text.tokenizer import StreamDecoder
        self.decoder = StreamDecoder(tokenizer)
        self.out, self.colors, self.reset = out, colors or {}, reset

    def __call__(self, token_id: int, kind: str) -> None:
        text = self.decoder.push(token_id)
        if text:
            color = self.colors.get(kind)
            self.out.write(f"{color}{text}{self.reset}" if color else text)
            self.out.flush()

    def flush(self) -> None:
        text = self.decoder.flush()
        if text:
            self.out.write(text)
            self.out.flush()
