"""SentencePiece-style ("llama" vocabulary) tokenization, exactly as llama.cpp does it.

llama.cpp's llm_tokenizer_spm_session::tokenize (llama-vocab.cpp) is a score-driven bigram merge
over the characters of one text fragment (spaces already escaped to U+2581, special tokens
already cut out by tokenizer_st_partition):

1. split the fragment into characters, each a symbol;
2. for every adjacent pair whose concatenation is a vocabulary token, queue a bigram with that
   token's score;
3. repeatedly pop the best bigram (highest score, then leftmost), skip it if either side has
   changed since it was queued (the lengths no longer add up), else merge the right symbol into
   the left one and queue the new pairs with its neighbours;
4. emit every remaining symbol as its token, or, when it is not in the vocabulary, as one
   byte-fallback token per UTF-8 byte (llama_vocab::byte_to_token: "<0xXX>", else the byte's
   own one-character token).

Neither library reproduces this rule by construction: ``sentencepiece`` never forms CONTROL or
BYTE pieces from text and resegments UNUSED ones, and a ``tokenizers`` BPE whose merges are all
token splits ranked by score breaks equal-score ties by merge rank rather than by position (and
for Gemma-3's 262,144 tokens needs 514,847 merges: ~2.3 s to derive and build).  So the rule is
implemented here directly: 0.1-0.2 s for 20,000 characters, no build cost beyond the
vocabulary dictionary the tokenizer holds anyway.  Special tokens and user-defined whitespace
runs are cut out first, so the fragments this sees are short in practice.
"""
from __future__ import annotations

from dataclasses import dataclass
from heapq import heappop, heappush
from typing import Mapping, Sequence

from ..errors import TokenizerError

ESCAPED_SPACE = "\u2581"   # llama_escape_whitespace: ' ' -> U+2581 (LOWER ONE EIGHTH BLOCK)


def escape_whitespace(text: str) -> str:
    """llama_escape_whitespace: every ' ' becomes U+2581."""
    return text.replace(" ", ESCAPED_SPACE)


def byte_token_ids(token_to_id: Mapping[str, int]) -> tuple[int | None, ...]:
    """(256,) token id of each byte as llama_vocab::byte_to_token finds it for SPM: the
    "<0xXX>" token, else the token whose text is that single byte; None where neither exists."""
    out = []
    for b in range(256):
        tid = token_to_id.get(f"<0x{b:02X}>")
        if tid is None and b < 0x80:
            tid = token_to_id.get(chr(b))
        out.append(tid)
    return tuple(out)


@dataclass(frozen=True, eq=False, repr=False)
class SpmModel:
    """The merge rule of llm_tokenizer_spm over a fixed vocabulary.

    token_to_id: token text -> id (every token, whatever its type, as llama.cpp's text_to_token)
    scores:      (n_vocab,) float score of each token (tokenizer.ggml.scores)
    byte_ids:    (256,) byte-fallback token of each byte, None where the vocabulary has none
    """
    token_to_id: Mapping[str, int]
    scores: Sequence[float]
    byte_ids: tuple[int | None, ...]
    source: str

    @classmethod
    def build(cls, token_to_id: Mapping[str, int], scores: Sequence[float], source: str) -> SpmModel:
        return cls(token_to_id, scores, byte_token_ids(token_to_id), source)

    def tokenize(self, text: str) -> list[int]:
        """Token ids of one raw fragment (already whitespace-escaped), llm_tokenizer_spm_session."""
        n = len(text)
        if n == 0:
            return []
        get = self.token_to_id.get
        scores = self.scores
        start = list(range(n))            # (n,) first character of each symbol
        length = [1] * n                  # (n,) characters in each symbol; 0 = merged away
        prev = list(range(-1, n - 1))     # (n,) linked list of live symbols
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        queue: list[tuple[float, int, int, int]] = []   # (-score, left, right, size)

        def try_add_bigram(left: int, right: int) -> None:
            if left < 0 or right < 0:
                return
            size = length[left] + length[right]
            tid = get(text[start[left]:start[left] + size])
            if tid is not None:
                heappush(queue, (-scores[tid], left, right, size))

        for i in range(1, n):
            try_add_bigram(i - 1, i)
        while queue:
            _, left, right, size = heappop(queue)
            if length[left] == 0 or length[right] == 0 or length[left] + length[right] != size:
                continue                                  # a side changed since it was queued
            length[left] = size
            length[right] = 0
            after = nxt[right]
            nxt[left] = after
            if after >= 0:
                prev[after] = left
            try_add_bigram(prev[left], left)
            try_add_bigram(left, after)

        # resegment: a merged symbol is always a token (it was queued only because it was one);
        # so only single characters outside the vocabulary remain, and llama.cpp's rev_merge map
        # never has an entry for them: they go out as byte tokens.
        out: list[int] = []
        i = 0
        while i != -1:
            piece = text[start[i]:start[i] + length[i]]
            tid = get(piece)
            if tid is not None:
                out.append(tid)
            else:
                for b in piece.encode("utf-8", errors="surrogatepass"):
                    bid = self.byte_ids[b]
                    if bid is None:
                        raise TokenizerError(f"{self.source}: cannot tokenize {piece!r}: the vocabulary "
                                             f"has no byte token for 0x{b:02X}")
                    out.append(bid)
            i = nxt[i]
        return out
