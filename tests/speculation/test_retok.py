"""A draft model of another vocabulary drafting through text (drafters/retok.py).

p is always the target's distribution, q the draft's.  The same guarantees as every drafter
(test_speculative, test_drafters): greedy output identical to plain greedy, and the exact law
of the output enumerated over every random decision, here with a target and a draft of two
different byte-level BPE vocabularies (synth.tokenizer_metadata); then the text machinery
(safe points, incremental re-encoding, the boundary of a draft), the compatibility rule, the
API and CLI wiring, and one real pair (SmolLM2 drafting for Qwen).
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import specdec
from fakes import FakeSession, enumerate_outcomes, window_logits
from helpers import sampling_params, target_law
from synth import TinySpec, tokenizer_metadata
from specdec.errors import ConfigError, IncompatibleDraftError
from specdec.generation.plain import generate_plain
from specdec.api.request import DraftOptions
from specdec.generation.sampling import GREEDY, NumpyRandom
from specdec.speculation.compat import check_compatible
from specdec.speculation.drafters import ModelDrafter, RetokenizingDrafter, make_drafter
from specdec.speculation.drafters.retok import (IdText, Spelling, TextTokens, complete_utf8,
                                                continuation, last_safe_point)
from specdec.speculation.policies import AdaptiveLength, FixedLength
from specdec.speculation.speculative import generate_speculative
from specdec.text.tokenizer import Tokenizer

# two byte-level BPE vocabularies over the same bytes (a b c, space Ġ, newline Ċ, and é as
# Ã©), merging differently; the last token of each is the same special (CONTROL) end token
T_TOKENS = ("a", "b", "c", "Ġ", "Ċ", "Ã", "©", "ab", "Ġa", "Ã©", "abc", "Ġab", "ca", "<e>")
T_MERGES = ("a b", "Ġ ab", "Ġ a", "Ã ©", "ab c", "c a")
D_TOKENS = ("a", "b", "c", "Ġ", "Ċ", "Ã", "©", "ba", "Ġb", "bc", "bb", "Ġc", "aa", "<e>")
D_MERGES = ("b a", "Ġ b", "b c", "b b", "Ġ c", "a a")
T_SPEC = TinySpec(n_vocab=len(T_TOKENS), tokens=T_TOKENS, merges=T_MERGES,
                  token_types=(1,) * (len(T_TOKENS) - 1) + (3,))
D_SPEC = TinySpec(n_vocab=len(D_TOKENS), tokens=D_TOKENS, merges=D_MERGES,
                  token_types=(1,) * (len(D_TOKENS) - 1) + (3,))
# tiny ones for enumerating the output law: 5 ids each
T5 = TinySpec(n_vocab=5, tokens=("a", "b", "Ġ", "ab", "Ġa"), merges=("a b", "Ġ a"))
D5 = TinySpec(n_vocab=5, tokens=("a", "b", "Ġ", "ba", "bb"), merges=("b a", "b b"))


def tokenizer(spec: TinySpec, name: str) -> Tokenizer:
    return Tokenizer.from_metadata(tokenizer_metadata(spec), name)


TT, DT = tokenizer(T_SPEC, "target"), tokenizer(D_SPEC, "draft")
TS, DS = Spelling(TT), Spelling(DT)


def spelled(spelling: Spelling, ids) -> bytes:
    return b"".join(map(spelling.piece, ids))


def oracle_logits(draft_tok: Tokenizer, text: bytes, seed: int):
    """A draft that knows `text`: where its context spells a prefix of text it favours the
    draft token spelling the most of what follows; random logits elsewhere."""
    sp = Spelling(draft_tok)
    noise = window_logits(draft_tok.n_vocab, seed)

    def fn(ctx: tuple[int, ...]) -> np.ndarray:
        row = noise(ctx).copy()
        have = spelled(sp, ctx)
        if text.startswith(have) and len(have) < len(text):
            rest = text[len(have):]
            best = max(range(draft_tok.n_vocab), key=lambda i: (rest.startswith(sp.piece(i)) and
                                                                len(sp.piece(i)), -i))
            row[best] += 20.0
        return row
    return fn


# ---- the text machinery -------------------------------------------------------------------

def test_safe_points_and_incomplete_characters():
    assert last_safe_point(b"ab cd", 5) == 2                 # a space between a non-space and a letter
    assert last_safe_point(b"ab\ncd", 5) == 3                # after a newline, before a non-space
    assert last_safe_point(b"ab cd", 3) is None              # the letter after it must be known
    assert last_safe_point(b"ab  cd", 6) is None and last_safe_point(b"ab (d", 5) is None
    assert last_safe_point(b"x" * 300 + b" ab" + b"x" * 300, 603) is None   # beyond the lookback
    e = "é€😀".encode()
    assert complete_utf8(e) == len(e)
    for cut, want in ((1, 0), (3, 2), (4, 2), (5, 5), (6, 5), (8, 5)):
        assert complete_utf8(e[:cut]) == want, cut
    assert complete_utf8(b"a\x80\x80") == 3                  # stray bytes are not a character


def test_spelling_encodes_any_bytes():
    for data in (b"cab ab\nabc", "é".encode(), b"\xa9ab", b"ab\xc3", b"a\xff b"):
        ids, ends = TS.encode(data)
        pieces = [TS.piece(t) for t in ids]
        assert b"".join(pieces) == data.replace(b"\xff", b"")  # a byte with no token is skipped
        assert ends == list(np.cumsum([len(p) for p in pieces])) or b"\xff" in data
    assert TS.encode("é".encode())[0] == [TT.token_to_id["Ã©"]]
    assert TS.encode(b"\xa9")[0] == [TT.token_to_id["©"]]


WORDS = st.text(alphabet="abcé", min_size=1, max_size=6)
TEXTS = st.lists(st.tuples(st.sampled_from([" ", "\n", "  ", " \n"]), WORDS), max_size=8).map(
    lambda parts: ("\n" + "".join(s + w for s, w in parts)).encode())


@settings(max_examples=150, deadline=None)
@given(texts=st.lists(TEXTS, min_size=1, max_size=5), cuts=st.lists(st.integers(0, 60), min_size=5, max_size=5))
def test_incremental_draft_ids_equal_encoding_the_whole_text(texts, cuts):
    """Texts edited at random (cut back, then grown): the draft ids kept incrementally are
    those of encoding the whole text each time (every change has a safe point before it)."""
    tt = TextTokens(DS)
    data = b""
    for text, cut in zip(texts, cuts):
        for step in (data[: max(0, len(data) - cut)], data[: max(0, len(data) - cut)] + text):
            data = step
            assert tt.sync(data) == DS.encode(data)[0], data


def test_appending_encodes_only_a_short_tail():
    words = [("ab", "cab", "é", "bca")[i % 4] for i in range(400)]
    text = ("\n" + " ".join(words)).encode()
    tt = TextTokens(DS)
    tt.sync(text)
    before = tt.n_encoded
    for i in range(40):
        text += b"ab c"[i % 4: i % 4 + 1]
        assert tt.sync(text) == DS.encode(text)[0]
    assert tt.n_encoded - before < 40 * 16            # bytes re-encoded per append: a few


@settings(max_examples=100, deadline=None)
@given(parts=st.lists(st.lists(st.sampled_from(b"abc \n\xc3\xa9"), max_size=6).map(bytes) |
                      st.text(alphabet="abc é\n", max_size=8).map(str.encode), max_size=12))
def test_incremental_draft_ids_always_spell_the_text(parts):
    """Any bytes the vocabulary has tokens for (UTF-8 or not), appended piece by piece (no
    safe point needed): the ids spell them exactly."""
    tt, data = TextTokens(TS), b""
    for part in parts:
        data += part
        assert spelled(TS, tt.sync(data)) == data


def test_target_text_is_kept_incrementally_and_skips_a_bos():
    it = IdText(TS, skip_first=7)
    assert it.sync([7, 0, 1]) == b"ab" and it.sync([7, 0, 1, 3]) == b"ab "
    assert it.sync([7, 2]) == b"c" and it.sync([0]) == b"a" and it.ends == [1]


def ids_of(*texts):
    return [TT.token_to_id[t] for t in texts]


def test_continuation_at_the_boundaries():
    # a draft ending inside a multi-byte character: the character is left out, and the id
    # before it could still merge (" ab" + "c" -> " ab", "c"? no: kept only up to the last but one)
    assert continuation(TS, b"c", b"ab ab\xc3") == ids_of("ab")
    # an unfinished merge: " a" may still become " ab", so it is dropped
    assert continuation(TS, b"c", b"ab a") == ids_of("ab")
    assert continuation(TS, b"c", b"ab ab a") == ids_of("ab", "Ġab")
    # a merge across the context's end ("a" + "bc" is "abc"): spelled again from the end
    assert continuation(TS, b"ca", b"bcab ") == ids_of("b", "c", "ab")
    # the context ends inside "é" (Ã©): the draft completes it with its last byte
    assert continuation(TS, b"a\xc3", b"\xa9b ") == ids_of("©", "b")
    # a special token at the end cannot change: kept
    assert continuation(TS, b"", b"ab<e>") == ids_of("ab", "<e>")
    assert continuation(TS, b"ab", b"") == [] and continuation(TS, b"", b"a") == []
    for tail, drafted in ((b"c", b"ab ab\xc3"), (b"ca", b"bcab "), (b"a\xc3", b"\xa9b ")):
        assert drafted.startswith(spelled(TS, continuation(TS, tail, drafted)))


# ---- exactness ----------------------------------------------------------------------------

def retok_pair(target_spec, draft_spec, seed, relation, prompt, n_predict):
    """(target session, drafter, draft session) of FakeSessions over two vocabularies."""
    t_tok, d_tok = tokenizer(target_spec, "target"), tokenizer(draft_spec, "draft")
    target = FakeSession(t_tok.n_vocab, window_logits(t_tok.n_vocab, seed))
    if relation == "oracle":
        plain = generate_plain(target, prompt, n_predict, GREEDY, NumpyRandom(0), set())
        text = spelled(Spelling(t_tok), list(prompt) + plain.ids)
        draft = FakeSession(d_tok.n_vocab, oracle_logits(d_tok, text, seed + 1))
    else:
        draft = FakeSession(d_tok.n_vocab, window_logits(d_tok.n_vocab, seed + 104729, window=1, scale=2.5))
    return target, RetokenizingDrafter(draft, d_tok, t_tok, t_tok.n_vocab), draft


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**20), prompt=st.lists(st.integers(0, len(T_TOKENS) - 2), min_size=1, max_size=8),
       relation=st.sampled_from(["oracle", "oracle", "bad"]), adaptive=st.booleans(),
       use_eog=st.booleans())
def test_greedy_retokenized_equals_greedy_plain(seed, prompt, relation, adaptive, use_eog):
    n_predict = 24
    target, drafter, draft = retok_pair(T_SPEC, D_SPEC, seed, relation, prompt, n_predict)
    eog = {len(T_TOKENS) - 1} if use_eog else set()
    want = generate_plain(target, prompt, n_predict, GREEDY, NumpyRandom(0), eog)
    for draft_n in (1, 2, 3, 5, 8):
        policy = AdaptiveLength(n_max=draft_n, n_init=1) if adaptive else FixedLength(draft_n)
        got = generate_speculative(target, drafter, prompt, n_predict, GREEDY, NumpyRandom(draft_n),
                                   eog, policy=policy)
        assert got.ids == want.ids and got.stop_reason == want.stop_reason
        # the draft cache holds a prefix of the draft ids of the accepted text
        assert draft.tokens == drafter.cache.ids
        assert drafter.cache.ids == (drafter._bos + drafter.tokens.ids)[: len(drafter.cache.ids)]


def test_an_oracle_draft_is_mostly_accepted():
    prompt = [TT.token_to_id[t] for t in ("ca", "Ġab", "c")]
    target, drafter, _ = retok_pair(T_SPEC, D_SPEC, 5, "oracle", prompt, 40)
    got = generate_speculative(target, drafter, prompt, 40, GREEDY, NumpyRandom(0), set(), draft_n=4)
    s = got.stats
    assert s.by_drafter and set(s.by_drafter) == {"retok"}
    assert s.n_accepted >= s.n_drafted // 3, (s.n_accepted, s.n_drafted)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**20), data=st.data(), n_predict=st.integers(2, 3),
       draft_n=st.integers(1, 3), relation=st.sampled_from(["oracle", "bad"]), params=sampling_params,
       use_eog=st.booleans())
def test_exact_output_law(seed, data, n_predict, draft_n, relation, params, use_eog):
    """Sampling targets: the output law enumerated over every random decision is the target's."""
    prompt = data.draw(st.lists(st.integers(0, 4), min_size=1, max_size=4))
    target, drafter, _ = retok_pair(T5, D5, seed, relation, prompt, n_predict)
    eog = {0} if use_eog else set()

    def run(rng):
        res = generate_speculative(target, drafter, prompt, n_predict, params, rng, eog, draft_n)
        return tuple(res.ids), res.stop_reason

    got, want = enumerate_outcomes(run), target_law(target, prompt, n_predict, params, eog)
    assert abs(sum(got.values()) - 1.0) < 1e-12
    for key in set(got) | set(want):
        assert abs(got.get(key, 0.0) - want.get(key, 0.0)) < 1e-9, key


def test_exact_output_law_longer():
    """Deeper: 4 tokens, drafts of up to 3 target ids, an oracle draft, all filters on."""
    from specdec.generation.sampling import SamplerParams
    params = SamplerParams(temperature=1.1, top_k=3, top_p=0.95, min_p=0.05)
    prompt = [3, 2]
    target, drafter, _ = retok_pair(T5, D5, 11, "oracle", prompt, 4)

    def run(rng):
        return tuple(generate_speculative(target, drafter, prompt, 4, params, rng, set(), 3).ids)

    got = enumerate_outcomes(run)
    want = {k[0]: v for k, v in target_law(target, prompt, 4, params, set()).items()}
    assert set(got) == set(want)
    assert max(abs(got[k] - want[k]) for k in want) < 1e-9


def test_drafts_are_greedy_whatever_the_sampler():
    """The proposal is a function of the context alone: the rng is never drawn from."""
    class NoDraws:
        def bernoulli(self, p):
            raise AssertionError("drew")
        categorical = bernoulli
    prompt = [0, 1, 3]
    target, drafter, _ = retok_pair(T_SPEC, D_SPEC, 3, "oracle", prompt, 12)
    a = drafter.propose(prompt, 4, NoDraws())
    drafter.reset()
    b = drafter.propose(prompt, 4, NoDraws())
    assert a.tokens == b.tokens and len(a.tokens) <= 4
    assert np.array_equal(a.q, np.eye(len(T_TOKENS))[list(a.tokens)])


# ---- compatibility, API, CLI ------------------------------------------------------------------

@pytest.fixture(scope="module")
def pair(tiny_model):
    """(target, draft) specdec Models: tiny transformers over the two vocabularies."""
    kw = dict(d_model=16, n_head=2, n_head_kv=1, d_ff=24, logit_scale=4.0)
    from dataclasses import replace
    return tiny_model(replace(T_SPEC, seed=1, **kw)), tiny_model(replace(D_SPEC, seed=2, **kw))


def test_compat_refuses_another_vocabulary_unless_retokenizing(pair):
    target, draft = pair
    with pytest.raises(IncompatibleDraftError) as e:
        check_compatible(target.tokenizer, draft.tokenizer, target.name, draft.name)
    msg = str(e.value)
    assert "\n" not in msg and "--draft-retokenize" in msg and draft.name in msg and "token texts differ" in msg
    check_compatible(target.tokenizer, draft.tokenizer, target.name, draft.name, retokenize=True)
    with pytest.raises(IncompatibleDraftError):
        target.generate("ab", n_predict=2, draft=draft)
    assert isinstance(make_drafter(draft, target, GREEDY, retokenize=True), RetokenizingDrafter)
    assert isinstance(make_drafter(target, target, GREEDY), ModelDrafter)
    with pytest.raises(ConfigError) as e:
        DraftOptions(kind="prompt-lookup", retokenize=True)
    assert "--draft-retokenize" in str(e.value)


def test_api_generate_retokenized_equals_plain(pair):
    target, draft = pair
    for prompt in ("ab ca", "c\nabc é ab"):
        want = target.generate(prompt, n_predict=30, ignore_eos=True)
        for kw in (dict(draft=draft), dict(draft="model", draft_model=draft, draft_n=4, draft_policy="fixed"),
                   dict(draft=target)):                        # the same vocabulary: retokenized too
            got = target.generate(prompt, n_predict=30, ignore_eos=True, draft_retokenize=True, **kw)
            assert got.ids == want.ids, kw
            if "draft_n" in kw:                     # asked for: the draft model through text drafts
                assert set(got.stats.by_drafter) == {"retok"}, kw
            else:                                   # the defaults: it, or lookup, where rows pay
                assert set(got.stats.by_drafter) <= {"retok", "prompt-lookup"}, kw
    opts = DraftOptions(model=draft, retokenize=True)
    assert "through text" in opts.describe()


def test_conversation_with_a_retokenizing_draft(pair):
    target, draft = pair
    conv = specdec.Conversation(target, draft=draft, draft_retokenize=True, ignore_eos=True)
    assert isinstance(conv.drafter.model, RetokenizingDrafter)     # hybrid under the defaults


def test_cli_refuses_without_the_flag_and_drafts_with_it(pair, capsys):
    from specdec.frontends import cli
    target, draft = pair
    args = ["run", "-m", target.path, "-md", draft.path, "-p", "ab ca", "-n", "12", "--ignore-eos", "--raw"]
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("specdec: error:")]
    assert len(lines) == 1 and "--draft-retokenize" in lines[0] and "Traceback" not in err
    assert cli.main(args + ["--draft-retokenize", "-v"]) == 0
    out = capsys.readouterr()
    assert "through text" in out.err and "retok" in out.err
    assert cli.main(["run", "-m", target.path, "-p", "ab ca", "-n", "12", "--ignore-eos", "--raw"]) == 0
    assert capsys.readouterr().out == out.out                   # the same text as plain


# ---- a real pair ----------------------------------------------------------------------------

@pytest.mark.real
def test_smollm2_drafting_for_qwen_is_identical_to_plain(real_model):
    target = real_model("qwen2.5-coder-1.5b-instruct-q4_k_m")
    draft = real_model("smollm2-135m-instruct-q4_1")
    prompt = target.chat_prompt([{"role": "user", "content": "Write a Python function that reverses a string."}])
    with pytest.raises(IncompatibleDraftError) as e:
        target.generate(prompt, n_predict=2, draft=draft)
    assert "--draft-retokenize" in str(e.value) and "\n" not in str(e.value)
    want = target.generate(prompt, n_predict=24, ignore_eos=True)
    got = target.generate(prompt, n_predict=24, ignore_eos=True, draft=draft, draft_retokenize=True,
                          draft_n=5, draft_policy="fixed")
    print(f"\nretok: accepted {got.stats.n_accepted}/{got.stats.n_drafted}")
    assert got.ids == want.ids and len(got.ids) == 24
    assert got.stats.n_accepted > 0


def test_a_sentencepiece_vocabulary_spells_text_pieces_without_a_space_prefix():
    """Tokenizer.encode(continued=True): a piece of a longer text gets no SentencePiece space
    prefix, so the draft ids of a text tail spell exactly that tail."""
    toks = ["<unk>", "<s>", "</s>", "\u2581", "a", "b", "\u2581a", "ab", "\u2581ab"]
    meta = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": toks,
            "tokenizer.ggml.scores": [0.0, 0.0, 0.0, -1.0, -2.0, -2.0, -1.5, -1.0, -0.5],
            "tokenizer.ggml.token_type": [2, 3, 3, 1, 1, 1, 1, 1, 1], "tokenizer.ggml.add_bos_token": False}
    spm = Tokenizer.from_metadata(meta, "spm")
    assert spm.decode(spm.encode("ab")) == " ab" and spm.decode(spm.encode("ab", continued=True)) == "ab"
    sp = Spelling(spm)
    for data in (b"ab a", b"b ab", b" ab"):
        ids, ends = sp.encode(data)
        assert spelled(sp, ids) == data and ends[-1] == len(data)
    tt = TextTokens(sp)
    assert spelled(sp, tt.sync(b"ab ab")) == b"ab ab" and spelled(sp, tt.sync(b"ab abab b")) == b"ab abab b"


@pytest.mark.real
def test_incremental_ids_of_the_real_vocabularies_equal_encoding_the_whole_text():
    """SmolLM2's and Qwen's tokenizers (metadata only) on the benchmark prompts, the text
    grown a few target ids at a time as generation grows it."""
    import json
    from pathlib import Path
    from helpers import real_model_path
    from specdec.engine.gguf_file import GGUFFile
    toks = {m: Tokenizer.from_metadata(GGUFFile(real_model_path(m)).metadata, m)
            for m in ("qwen2.5-coder-1.5b-instruct-q4_k_m", "smollm2-135m-instruct-q4_1")}
    qwen, smol = toks.values()
    records = [json.loads(line) for f in sorted((Path(__file__).parents[2] / "benchmarks" / "prompts").glob("*.jsonl"))
               for line in f.read_text().splitlines() if line.strip()]
    prompts = [r["prompt"] if "prompt" in r else r["code"] if "code" in r     # large_files: the code
               else "\n".join(m["content"] for m in r["messages"]) for r in records]   # structured: the chat
    for t_tok, d_tok in ((qwen, smol), (smol, qwen)):
        text, tt = IdText(Spelling(t_tok)), TextTokens(Spelling(d_tok))
        for prompt in prompts:
            ids = t_tok.encode(prompt, bos=False)
            for n in range(1, len(ids) + 1, 3):
                data = text.sync(ids[:n])
                got = tt.sync(data)
            assert got == d_tok.encode(data.decode(), bos=False), prompt[:40]


def test_compat_follows_llamacpp_rules():
    """common_speculative_are_compatible: vocab type; add-BOS / add-EOS flags, and the ids
    only where they are added; sizes within 128; token texts from id 5 on."""
    from types import SimpleNamespace
    from specdec.speculation.compat import vocab_differences

    def tok(**kw):
        base = dict(vocab_type="bpe", bos_id=1, eos_id=2, add_bos=False, add_eos=False,
                    tokens=[f"t{i}" for i in range(300)])
        return SimpleNamespace(**{**base, **kw})
    t = tok()
    assert vocab_differences(t, tok(eos_id=7, bos_id=9)) == []        # neither adds them
    assert vocab_differences(t, tok(tokens=t.tokens[:200])) == []     # 100 apart: within 128
    assert vocab_differences(tok(add_bos=True), tok(add_bos=True, bos_id=9)) == ["BOS id 1 vs 9"]
    assert vocab_differences(t, tok(add_eos=True)) == ["add-EOS flag False vs True"]
    assert vocab_differences(t, tok(vocab_type="spm")) == ["vocab type 'bpe' vs 'spm'"]
    assert "more than 128 apart" in vocab_differences(t, tok(tokens=t.tokens[:100]))[0]
    assert vocab_differences(t, tok(tokens=["x"] * 5 + t.tokens[5:])) == []   # ids < 5 unchecked
    assert "1 token texts differ" in vocab_differences(t, tok(tokens=t.tokens[:6] + ["y"] + t.tokens[7:]))[0]
