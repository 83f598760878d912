"""The terminal side of specdec: one-line summaries, and the interactive chat loop of
`specdec chat` / `specdec run -cnv`.

Chat keys: Enter sends a turn (a line ending in a backslash continues on the next line);
Ctrl-C while an answer streams stops it and returns to the prompt, the conversation keeping
what was shown; Ctrl-D (end of input) or Ctrl-C at the prompt ends the chat.  `/clear`
forgets the conversation.  Answers go to stdout, one summary line per turn to stderr.
"""
from __future__ import annotations

import sys
from typing import IO

from ..errors import SpecdecError
from .printer import TokenPrinter

COLORS = {"accepted": "\x1b[32m", "predicted": "\x1b[36m",      # green, cyan (from --predict)
          "correction": "\x1b[31m", "bonus": "\x1b[34m"}           # red, blue
RESET = "\x1b[0m"
PROMPT = "> "


def summary_line(out, plain=None, n_reused: int | None = None) -> str:
    """One line: tokens, tok/s, prompt, acceptance and tokens/step (speculative), speedup
    over the target alone (when `plain`, the same request without a draft, is given)."""
    t = out.timings
    parts = [f"{len(out.ids)} tokens in {t.decode_s:.2f} s = {t.tokens_per_s:.2f} tok/s"]
    if n_reused is None:
        parts.append(f"prompt {len(out.prompt_ids)} tokens in {t.prompt_s:.2f} s")
    else:
        parts.append(f"prompt {len(out.prompt_ids) - n_reused} new tokens in {t.prompt_s:.2f} s "
                     f"({n_reused} cached)")
    s = out.stats
    if s is not None:
        parts.append(f"acceptance {s.acceptance_rate:.1%} ({s.n_accepted}/{s.n_drafted}), "
                     f"{s.tokens_per_step:.2f} tokens/step")
    if plain is not None:
        speed = t.tokens_per_s / plain.timings.tokens_per_s if plain.timings.tokens_per_s else 0.0
        same = "same tokens" if plain.ids == out.ids else "different tokens (sampled)"
        parts.append(f"speedup {speed:.2f}x over the target alone "
                     f"({plain.timings.tokens_per_s:.2f} tok/s, {same})")
    parts.append(f"stop: {out.stop_reason}")
    return "specdec: " + "; ".join(parts)


def detail_lines(out) -> list[str]:
    """What --verbose adds for a speculative run."""
    s = out.stats
    if s is None:
        return []
    by_pos = " ".join("-" if r is None else f"{r:.2f}" for r in s.acceptance_by_position)
    return [f"specdec: steps {s.n_steps}, drafted {s.n_drafted}, accepted {s.n_accepted}; "
            f"predicted acceptance 1 - TV(p, q) {s.predicted_acceptance:.1%} vs measured "
            f"{s.measured_acceptance:.1%}",
            f"specdec: acceptance by draft position: {by_pos}; draft {s.draft_s:.2f} s, "
            f"verify {s.verify_s:.2f} s"]


def read_turn(stdin: IO[str], out: IO[str], tty: bool) -> str | None:
    """One user turn, or None at end of input.  Lines ending in a backslash continue."""
    lines = []
    while True:
        prompt = PROMPT if not lines else ""
        if tty:
            line = input(prompt)                    # readline editing; EOFError at Ctrl-D
        else:
            line = stdin.readline()
            if not line:
                raise EOFError
            line = line.rstrip("\n")
            out.write(f"{prompt}{line}\n")          # a transcript that reads like the terminal
        if line.endswith("\\"):
            lines.append(line[:-1])
            continue
        lines.append(line)
        return "\n".join(lines)


def chat_loop(conv, n_predict: int, *, first: str | None = None, colors: bool = False,
              verbose: bool = False, stdin: IO[str] | None = None, out: IO[str] | None = None,
              err: IO[str] | None = None) -> int:
    """Talk with `conv` (a specdec.Conversation) until end of input.  Returns the exit code."""
    stdin, out, err = stdin or sys.stdin, out or sys.stdout, err or sys.stderr
    tty = stdin.isatty()
    if tty:
        try:
            import readline  # noqa: F401  (line editing and history for input())
        except ImportError:
            pass
        err.write("specdec: chat ready: Enter sends, a trailing \\ continues the line, Ctrl-C "
                  "stops an answer, Ctrl-D or Ctrl-C at the prompt quits, /clear starts afresh\n")
        err.flush()
    pending = first
    if first is not None:
        out.write(f"{PROMPT}{first}\n")                 # the -p turn, shown as if typed
    while True:
        if pending is None:
            out.flush()
            try:
                pending = read_turn(stdin, out, tty)
            except (EOFError, KeyboardInterrupt):
                out.write("\n" if tty else "")
                out.flush()
                return 0
        text, pending = pending, None
        if text.strip() == "/clear":
            conv.clear()
            err.write("specdec: conversation cleared\n")
            continue
        if not text.strip():
            continue
        printer = TokenPrinter(conv.model.tokenizer, out, COLORS if colors else None, RESET)
        try:
            res = conv.say(text, n_predict, on_token=printer)
        except KeyboardInterrupt:
            printer.flush()
            out.write(f"{RESET if colors else ''}\n")
            out.flush()
            err.write(f"specdec: answer stopped; {conv.n_cached} tokens in the cache\n")
            err.flush()
            continue
        except SpecdecError as e:
            out.write("\n")
            out.flush()
            err.write(f"specdec: error: {e}\n")
            err.flush()
            continue
        printer.flush()
        out.write("\n")
        out.flush()
        err.write(summary_line(res, n_reused=conv.n_reused) + "\n")
        for line in detail_lines(res) if verbose else []:
            err.write(line + "\n")
        err.flush()
