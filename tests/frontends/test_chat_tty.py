"""`specdec chat` in a real terminal (a pseudo-terminal from the `pty` module): it answers two
turns, Ctrl-C stops an answer and returns to the prompt, the next turns reuse the KV cache,
and Ctrl-D ends the chat with exit code 0.

Uses SmolLM2-135M when it is in the model cache, else a tiny synthetic model."""
from __future__ import annotations

import os
import re
import signal
import select
import sys
import time

import pytest

from synth import TinySpec, write_tiny_model

pty = pytest.importorskip("pty")
TEMPLATE = ("{% for m in messages %}{{ m['role'][0] | upper }}{{ m['content'] }}{% endfor %}"
            "{% if add_generation_prompt %}A{% endif %}")
TURN_DONE = re.compile(rb"specdec: \d+ tokens in [\d.]+ s = [\d.]+ tok/s; prompt (\d+) new tokens "
                       rb"in [\d.]+ s \((\d+) cached\)")


def _model(tmp_path) -> tuple[str, list[str], list[str]]:
    """(model, extra flags, [long question, short question, short question])"""
    from specdec.models import hub
    try:
        path = str(hub.resolve("smollm2-135m-instruct-q4_1", download=False))
        return path, ["-n", "160"], ["Count from 1 to 100, one number per line.",
                                    "What is the capital of France?", "And of Italy?"]
    except Exception:
        p = write_tiny_model(tmp_path / "tiny.gguf", TinySpec(n_vocab=52, chat_template=TEMPLATE, n_ctx=4096))
        return str(p), ["-n", "1500", "--ignore-eos"], ["count", "hello", "again"]


class Terminal:
    """A child process on a pseudo-terminal: send keys, wait for output."""

    def __init__(self, argv: list[str]):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:                                   # the child: the chat itself
            os.environ["COLUMNS"] = "200"
            # a test run started in the background (`cmd &` in a script) inherits SIGINT
            # ignored, and Python keeps an ignored SIGINT ignored: give the chat the default
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.execv(sys.executable, [sys.executable, *argv])
        self.buf = b""

    def send(self, data: bytes) -> None:
        os.write(self.fd, data)

    def expect(self, pattern: bytes | re.Pattern, timeout: float = 180.0, start: int = 0) -> re.Match:
        rx = re.compile(re.escape(pattern)) if isinstance(pattern, bytes) else pattern
        deadline = time.monotonic() + timeout
        while True:
            m = rx.search(self.buf, start)
            if m:
                return m
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"timed out waiting for {rx.pattern!r}; output so far:\n"
                                     f"{self.buf.decode(errors='replace')}")
            r, _, _ = select.select([self.fd], [], [], min(left, 1.0))
            if r:
                try:
                    chunk = os.read(self.fd, 65536)
                except OSError:                             # EIO: the child has exited
                    chunk = b""
                if not chunk:
                    raise AssertionError(f"the chat exited while waiting for {rx.pattern!r}:\n"
                                         f"{self.buf.decode(errors='replace')}")
                self.buf += chunk

    def wait(self, timeout: float = 60.0) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                r, _, _ = select.select([self.fd], [], [], 0.2)
                if r:
                    self.buf += os.read(self.fd, 65536)
            except OSError:
                pass
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                return os.waitstatus_to_exitcode(status)
        os.kill(self.pid, 9)
        os.waitpid(self.pid, 0)
        raise AssertionError("the chat did not exit")

    def close(self) -> None:
        try:
            os.kill(self.pid, 9)
            os.waitpid(self.pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
        os.close(self.fd)


def _interrupt(term: Terminal, at: int) -> int:
    """Ctrl-C while an answer streams; again (only while it still streams) if the chat had
    not reacted within a second.  -> the end of 'answer stopped'."""
    for _ in range(30):
        term.send(b"\x03")
        try:
            return term.expect(b"answer stopped", timeout=1.0, start=at).end()
        except AssertionError:
            assert b"tokens in" not in term.buf[at:], "the answer ended: Ctrl-C was not seen"
    raise AssertionError("Ctrl-C did not stop the answer")


def test_chat_two_turns_and_ctrl_c(tmp_path):
    model, flags, (long_q, q1, q2) = _model(tmp_path)
    term = Terminal(["-m", "specdec.frontends.cli", "chat", "-m", model, "-md", model, "--draft-n", "3", *flags])
    try:
        term.expect(b"chat ready")
        at = term.expect(b"> ").end()
        term.send(long_q.encode() + b"\r")                  # a long answer ...
        term.expect(re.compile(rb"\r\n\S"), start=at + len(long_q))   # ... starts streaming
        at = _interrupt(term, at)                           # Ctrl-C stops it
        at = term.expect(b"> ", start=at).end()
        done = []
        for q in (q1, q2):                                  # two more turns, answered in full
            term.send(q.encode() + b"\r")
            m = term.expect(TURN_DONE, start=at)
            done.append((int(m.group(1)), int(m.group(2))))
            at = term.expect(b"> ", start=m.end()).end()
        assert all(cached > 0 and new < cached for new, cached in done), done
        term.send(b"\x04")                                  # Ctrl-D at the prompt quits
        assert term.wait() == 0
        assert b"Traceback" not in term.buf
    finally:
        term.close()
