"""Constrained generation: a JSON schema, any JSON object, a regular expression or a grammar
(GBNF as llama.cpp writes it, or Lark) decides which tokens may come next.

    spec = ConstraintSpec("json_schema", '{"type": "object", ...}')
    spec.check()                                  # ConstraintError naming the field, or nothing
    c = compile_constraint(spec, model.tokenizer) # one request's matcher
    c.mask()            (V,) bool: the tokens the grammar allows next
    c.advance(x)        consume x;  c.rollback(k) forget the last k consumed tokens
    c.forced()          tokens the grammar forces next (its canonical tokenization)
    c.done              only the end of generation may follow

Built on llguidance (docs/structured.md says why, with its measured cost): its tokenizer is
made from the engine's own token bytes (`Tokenizer.pieces`; control tokens marked with a
leading 0xff, as llguidance's llama.cpp binding does), once per vocabulary and process.

How generation uses it (plain.py, speculation/constrained.py): the mask is applied to the
logits before any sampling filter (llama.cpp applies its grammar sampler first), so the target
law at every position is the masked, renormalised distribution.  p is always the target's
distribution, q the draft's.
"""
from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..errors import ConstraintError

KINDS = ("json_schema", "json_object", "regex", "gbnf", "lark")
FIELDS = {"json_schema": "json_schema", "json_object": "response_format", "regex": "regex",
          "gbnf": "grammar", "lark": "grammar"}
MAX_GRAMMAR_BYTES = 65536       # the longest schema / grammar / regex text accepted (UTF-8 bytes)
ANY_OBJECT = '{"type": "object"}'


def _llguidance():
    try:
        import llguidance
        return llguidance
    except ImportError:
        raise ConstraintError("structured output needs llguidance: pip install 'specdec[structured]'",
                              "grammar") from None


@dataclass(frozen=True)
class ConstraintSpec:
    """What the output must match: kind one of KINDS; source the schema's JSON text, the
    regex or the grammar text ("" for json_object)."""
    kind: str
    source: str = ""

    @property
    def field(self) -> str:
        """The request field / flag this constraint came from (ConstraintError.field)."""
        return FIELDS.get(self.kind, "grammar")

    def grammar(self) -> str:
        """The llguidance grammar definition (unchecked)."""
        if self.kind not in KINDS:
            raise ConstraintError(f"constraint kind must be one of {', '.join(KINDS)}, got {self.kind!r}",
                                  "grammar")
        if not isinstance(self.source, str):
            raise ConstraintError(f"{self.field}: expected text, got {type(self.source).__name__}", self.field)
        size = len(self.source.encode("utf-8", "surrogatepass"))
        if size > MAX_GRAMMAR_BYTES:
            raise ConstraintError(f"{self.field}: {size} bytes, over the limit of {MAX_GRAMMAR_BYTES}", self.field)
        llg = _llguidance()
        try:
            if self.kind in ("json_schema", "json_object"):
                text = self.source if self.kind == "json_schema" else ANY_OBJECT
                schema = json.loads(text)
                if not isinstance(schema, (dict, bool)):
                    raise ConstraintError(f"{self.field}: a JSON schema is an object, got "
                                          f"{type(schema).__name__}", self.field)
                return llg.LLMatcher.grammar_from_json_schema(text)
            if not self.source.strip():
                raise ConstraintError(f"{self.field}: empty {self.kind}", self.field)
            return llg.grammar_from(self.kind, self.source)
        except ConstraintError:
            raise
        except Exception as e:                        # the library's parse errors: ValueError, RuntimeError, ...
            raise ConstraintError(f"{self.field}: {_one_line(e)}", self.field) from None

    def check(self) -> None:
        """Raise ConstraintError (one line, naming the field) unless this constrains anything."""
        grammar = self.grammar()
        try:
            is_error, messages = _llguidance().LLMatcher.validate_grammar_with_warnings(grammar)
        except Exception as e:
            is_error, messages = True, [str(e)]
        if is_error:
            raise ConstraintError(f"{self.field}: {_one_line(messages[0] if messages else 'invalid')}",
                                  self.field)

    @classmethod
    def of(cls, grammar: str | None = None, json_schema: "dict | str | None" = None,
           constraint: "ConstraintSpec | None" = None) -> "ConstraintSpec | None":
        """The one constraint of generate's keywords (GBNF text, a schema as a dict or JSON
        text, a ready spec); None when none is given.  More than one: ConstraintError."""
        given = [k for k, v in (("grammar", grammar), ("json_schema", json_schema),
                                ("constraint", constraint)) if v is not None]
        if len(given) > 1:
            raise ConstraintError(f"give at most one of grammar=, json_schema=, constraint= (got {', '.join(given)})",
                                  given[1])
        if constraint is not None:
            if not isinstance(constraint, ConstraintSpec):
                raise ConstraintError(f"constraint= takes a ConstraintSpec, got {type(constraint).__name__}",
                                      "grammar")
            return constraint
        if grammar is not None:
            if not isinstance(grammar, str):
                raise ConstraintError(f"grammar: expected GBNF text, got {type(grammar).__name__}", "grammar")
            return cls("gbnf", grammar)
        if json_schema is not None:
            if isinstance(json_schema, (dict, bool)):
                return cls("json_schema", json.dumps(json_schema))
            if not isinstance(json_schema, str):
                raise ConstraintError(f"json_schema: expected a dict or JSON text, got "
                                      f"{type(json_schema).__name__}", "json_schema")
            return cls("json_schema", json_schema)
        return None


def _one_line(e: object) -> str:
    return " ".join(str(e).split())[:300]


# -- the tokenizer llguidance masks over, one per vocabulary and process ---------------------
_LLTOK: dict[tuple[int, int], tuple[object, object]] = {}   # (id(tokenizer), V) -> (tokenizer, LLTokenizer)
_LLTOK_LOCK = threading.Lock()
CONTROL = 1 << 3                # text.vocab.ATTR_CONTROL


class _Encode:
    """What llguidance.TokenizerWrapper wraps: the vocabulary's token bytes and its encoder."""

    def __init__(self, tokenizer, n_vocab: int):
        self.tok = tokenizer
        eog = sorted(tokenizer.eog_ids) or ([tokenizer.eos_id] if tokenizer.eos_id is not None else [])
        self.eos_token_id = eog[0] if eog else 0
        self.bos_token_id = tokenizer.bos_id
        special = {i for i, a in enumerate(tokenizer.attrs) if a & CONTROL} | set(eog)   # never text
        pieces = [b"\xff" + p if i in special else p for i, p in enumerate(tokenizer.pieces)]
        self.tokens = pieces + [b""] * (n_vocab - len(pieces))     # padded ids print nothing
        self.special_token_ids = sorted(special)

    def __call__(self, text: "bytes | str") -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        return self.tok.encode(text, special=False, bos=False, eos=False, continued=True)


def ll_tokenizer(tokenizer, n_vocab: int | None = None):
    """llguidance's LLTokenizer of a specdec Tokenizer over n_vocab ids (None: the
    vocabulary's own), built once per vocabulary in this process."""
    llg = _llguidance()
    n = int(n_vocab or tokenizer.n_vocab)
    key = (id(tokenizer), n)
    with _LLTOK_LOCK:
        hit = _LLTOK.get(key)
        if hit is None or hit[0] is not tokenizer:
            enc = _Encode(tokenizer, n)
            eog = sorted(tokenizer.eog_ids) or [enc.eos_token_id]
            hit = _LLTOK[key] = (tokenizer, llg.LLTokenizer(llg.TokenizerWrapper(enc), n_vocab=n, eos_token=eog))
    return hit[1]


class Constraint:
    """One request's matcher: the grammar's state after the tokens consumed so far."""

    def __init__(self, spec: ConstraintSpec, lltok, n_vocab: int):
        llg = _llguidance()
        self.spec, self.n_vocab = spec, int(n_vocab)
        self.eos_ids = frozenset(int(t) for t in lltok.eos_tokens)
        self._m = llg.LLMatcher(lltok, spec.grammar(), log_level=0)
        if self._m.is_error():
            raise ConstraintError(f"{spec.field}: {_one_line(self._m.get_error())}", spec.field)
        self.n_consumed = 0             # tokens consumed since the start (or reset)
        self.mask_s, self.n_masks = 0.0, 0   # time spent computing masks, masks computed

    def mask(self) -> np.ndarray:
        """(V,) bool: the tokens allowed next (end-of-generation ids where the grammar may end)."""
        t = time.perf_counter()
        bits = np.frombuffer(self._m.compute_bitmask(), dtype=np.uint8)
        out = np.unpackbits(bits, bitorder="little")[: self.n_vocab].view(bool)
        self.mask_s += time.perf_counter() - t
        self.n_masks += 1
        return out

    def allowed(self, token: int) -> bool:
        return self._m.validate_tokens([int(token)]) == 1

    def n_allowed(self, tokens: Sequence[int]) -> int:
        """How many of tokens, in order from the current state, the grammar allows."""
        return int(self._m.validate_tokens([int(t) for t in tokens])) if len(tokens) else 0

    def advance(self, token: int) -> None:
        if not self._m.consume_token(int(token)):
            raise ConstraintError(f"{self.spec.field}: token {token} is not allowed here "
                                  f"({_one_line(self._m.get_error())})", self.spec.field)
        self.n_consumed += 1

    def rollback(self, n: int) -> None:
        if n:
            if n > self.n_consumed or not self._m.rollback(int(n)):
                raise ValueError(f"cannot roll back {n} of {self.n_consumed} tokens")
            self.n_consumed -= n

    def reset(self) -> None:
        self._m.reset()
        self.n_consumed = 0

    def forced(self) -> list[int]:
        """The tokens the grammar forces next (possibly none): its canonical tokenization of
        the forced text, a draft to verify, never to emit unverified."""
        return [int(t) for t in self._m.compute_ff_tokens()]

    @property
    def done(self) -> bool:
        """Only the end of generation may follow (the grammar can take nothing more)."""
        return self._m.is_stopped()

    @property
    def accepting(self) -> bool:
        return self._m.is_accepting()


_COMPILED: dict[tuple, object] = {}      # (spec, id(LLTokenizer)) -> a fresh matcher to copy
_COMPILED_MAX = 64


def compile_constraint(spec: ConstraintSpec, tokenizer, n_vocab: int | None = None) -> Constraint:
    """A fresh matcher for spec over the tokenizer's vocabulary (n_vocab: the model's number of
    ids, padded vocabularies have more than the tokenizer).  ConstraintError when invalid."""
    if not isinstance(spec, ConstraintSpec):
        raise ConstraintError(f"expected a ConstraintSpec, got {type(spec).__name__}", "grammar")
    n = int(n_vocab or tokenizer.n_vocab)
    lltok = ll_tokenizer(tokenizer, n)
    key = (spec, id(lltok))
    proto = _COMPILED.get(key)
    if proto is None:
        proto = Constraint(spec, lltok, n)
        if len(_COMPILED) >= _COMPILED_MAX:
            _COMPILED.pop(next(iter(_COMPILED)))
        _COMPILED[key] = proto
    c = object.__new__(Constraint)
    c.spec, c.n_vocab, c.eos_ids, c.n_consumed = proto.spec, proto.n_vocab, proto.eos_ids, 0
    c.mask_s, c.n_masks = 0.0, 0
    c._m = proto._m.deep_copy()
    return c


def masked(logits: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """logits with every forbidden id at -inf: (V,) or (M, V) with a mask of the same shape
    (float32, a copy).  What sampling.probs then warps is the masked, renormalised law."""
    out = np.array(logits, dtype=np.float32, copy=True)
    w = min(out.shape[-1], mask.shape[-1])
    view = out[..., :w]
    view[~mask[..., :w]] = -np.inf
    out[..., w:] = -np.inf                            # ids past the mask: none allowed
    return out
