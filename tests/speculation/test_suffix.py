"""The suffix store and the suffix drafter: the store's bounds (size, LRU over documents), the
drafting rule (longest match, then the most frequent continuation, stopping where the counts
branch) against a brute-force reference, files (round trip, a corrupt file is one line and
exit code 2), exactness (greedy identity, the exact output law), and the sharing across the
turns of a conversation and the requests of the server.

p is always the target's distribution, q the draft's.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fakes import PAIR_FACTORIES, RELATIONS, enumerate_outcomes
from helpers import factories, sampling_params, target_law
from specdec.errors import CacheFileError, ConfigError
from specdec.generation.plain import generate_plain
from specdec.generation.sampling import GREEDY, NumpyRandom, SamplerParams
from specdec.speculation.drafters import (HybridDrafter, ModelDrafter, PromptLookupDrafter,
                                          SuffixDrafter, SuffixStore, make_drafter)
from specdec.speculation.policies import AdaptiveLength, Threshold
from specdec.speculation.speculative import generate_speculative


def suffix_reference(ctx, docs, n_max, ngram_min, ngram_max, copy_ratio=0.0, min_share=0.5):
    """Brute force of the suffix rule over the context and the documents (oldest first)."""
    L = len(ctx)
    best, occ = 0, []
    for n in range(min(ngram_max, L), ngram_min - 1, -1):
        here = [(d, e) for d in docs for e in range(n, len(d)) if d[e - n: e] == ctx[L - n:]]
        here += [(None, e) for e in range(n, L) if ctx[e - n: e] == ctx[L - n:]]
        if here:
            best, occ = n, here
            break
    if not best:
        return []
    if copy_ratio:
        n_max = min(n_max, max(1, int(copy_ratio * best)))
    out: list[int] = []
    for k in range(n_max):
        nxt = []
        for d, e in occ:
            seq = (list(ctx) + out) if d is None else d
            if e + k < len(seq):
                nxt.append((seq[e + k], d, e))
        if not nxt:
            break
        votes = {}
        for i, (t, _, _) in enumerate(nxt):
            votes[t] = (votes.get(t, (0, 0))[0] + 1, i)
        t = max(votes, key=lambda x: votes[x])
        if k and votes[t][0] <= min_share * len(nxt):
            break
        out.append(t)
        occ = [(d, e) for x, d, e in nxt if x == t]
    return out


# ---- the store ---------------------------------------------------------------------------------

def test_store_is_bounded_lru_over_whole_documents():
    s = SuffixStore(max_tokens=10, anchors=(1, 2))
    s.add([1, 2, 3, 4])
    s.add([5, 6, 7])
    s.add([8, 9, 1])                                  # 10 tokens: all fit
    assert s.n_tokens == 10 and len(s) == 3
    s.touch([0])                                      # the first one was just drafted from
    s.add([4, 4])                                     # evicts the least recently used: [5, 6, 7]
    assert s.documents() == [[8, 9, 1], [1, 2, 3, 4], [4, 4]] and s.n_tokens == 9
    assert s.matches([0, 5, 6], 1, 4) == (0, [])      # its n-grams are gone from the index
    s.add(list(range(30)))                            # longer than the store: its last 10 ids
    assert s.documents() == [list(range(20, 30))] and s.n_tokens == 10
    s.add([7, 7], key="conv")                         # evicts it
    s.add([1, 1])
    s.add([7, 7, 8, 8], key="conv")                   # a keyed document replaces its earlier self
    assert s.documents() == [[1, 1], [7, 7, 8, 8]]
    off = SuffixStore(max_tokens=0)
    off.add([1, 2, 3])
    assert len(off) == 0
    for bad in (-1, 1.5):
        with pytest.raises(ConfigError):
            SuffixStore(max_tokens=bad)


def test_store_index_survives_many_evictions():
    rng = np.random.default_rng(0)
    s = SuffixStore(max_tokens=300, anchors=(1, 2, 4))
    docs = []
    for _ in range(200):
        d = rng.integers(0, 5, rng.integers(1, 40)).tolist()
        s.add(d)
        docs.append(d)
    kept = s.documents()
    assert s.n_tokens == sum(map(len, kept)) <= 300 and kept == docs[-len(kept):]
    ctx = rng.integers(0, 5, 12).tolist()
    d = SuffixDrafter(5, s, ngram_max=6, ngram_min=1, copy_ratio=0)
    assert d.tokens(ctx, 6) == suffix_reference(ctx, kept, 6, 1, 6)


def test_frequency_beats_recency():
    """`a b c` was followed by X three times and, most recently, by Y once: the suffix drafter
    drafts X, prompt lookup (the latest occurrence) Y."""
    a, b, c, X, Y = 1, 2, 3, 4, 5
    history = [9, a, b, c, X, 8, 0, a, b, c, X, 8, 7, a, b, c, X, 8, 6, a, b, c, Y, 8]
    ctx = history + [0, a, b, c]
    assert PromptLookupDrafter(10, ngram_max=3, copy_ratio=0).tokens(ctx, 2) == [Y, 8]
    assert SuffixDrafter(10, ngram_max=3, copy_ratio=0).tokens(ctx, 2) == [X, 8]
    store = SuffixStore(anchors=(2,))
    for doc in ([9, a, b, c, X, 8], [0, a, b, c, X, 8], [7, a, b, c, X, 8], [6, a, b, c, Y, 8]):
        store.add(doc)
    d = SuffixDrafter(10, store, ngram_max=3, copy_ratio=0)
    assert d.tokens([5, a, b, c], 2) == [X, 8] and d.key([5, a, b, c]) == "suffix/3-4"
    # longest match first: one earlier `6 a b c` continues with Y, whatever the counts
    d4 = SuffixDrafter(10, store, ngram_max=4, copy_ratio=0)
    assert d4.tokens([6, a, b, c], 2) == [Y, 8] and d4.match([6, a, b, c]).n == 4
    assert d.key([3, 3]) == "suffix/none" and d.tokens([3, 3], 4) == []


def test_the_run_stops_where_the_counts_branch():
    store = SuffixStore(anchors=(2,))
    for doc in ([1, 2, 3, 4, 5], [1, 2, 3, 4, 6], [1, 2, 3, 7, 7]):
        store.add(doc)
    d = SuffixDrafter(10, store, ngram_max=2, copy_ratio=0)
    assert d.tokens([1, 2], 5) == [3, 4]              # 3 (3 of 3), 4 (2 of 3), then 5 or 6: no majority
    assert SuffixDrafter(10, store, ngram_max=2, copy_ratio=0, min_share=0.4).tokens([1, 2], 5) == [3, 4, 6]
    assert SuffixDrafter(10, store, ngram_max=2, copy_ratio=1).tokens([1, 2], 5) == [3, 4]  # 1 per matched token
    with pytest.raises(ConfigError):
        SuffixDrafter(10, store, min_share=1.0)


@settings(max_examples=300, deadline=None)
@given(docs=st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=12), max_size=4),
       ops=st.lists(st.tuples(st.sampled_from(["extend", "extend", "edit", "shrink"]),
                              st.lists(st.integers(0, 3), min_size=1, max_size=4)), min_size=1, max_size=8),
       ngram_max=st.integers(1, 5), extra=st.integers(0, 2), n_max=st.integers(0, 6),
       copy_ratio=st.sampled_from([0.0, 1.0, 2.0]), min_share=st.sampled_from([0.0, 0.5, 0.7]))
def test_suffix_drafter_equals_brute_force(docs, ops, ngram_max, extra, n_max, copy_ratio, min_share):
    ngram_min = max(1, ngram_max - extra)
    store = SuffixStore(anchors=(1, 2, 4))
    for doc in docs:
        store.add(doc)
    d = SuffixDrafter(4, store, ngram_max=ngram_max, ngram_min=ngram_min, copy_ratio=copy_ratio,
                      min_share=min_share)
    ctx: list[int] = []
    for op, toks in ops:
        ctx = (ctx + toks if op == "extend" else ctx[:-1] + toks if op == "edit" and ctx
               else ctx[: len(ctx) // 2] + toks)
        want = suffix_reference(ctx, docs, n_max, ngram_min, ngram_max, copy_ratio, min_share)
        got = d.propose(ctx, n_max, NumpyRandom(0))
        assert list(got.tokens) == want, ctx
        assert got.source == "suffix" and got.q.shape == (len(want), 4)
        np.testing.assert_array_equal(got.q, np.eye(4)[want].reshape(len(want), 4))   # one-hot


# ---- files ---------------------------------------------------------------------------------------

def test_save_load_round_trip(tmp_path):
    s = SuffixStore(max_tokens=100, anchors=(1, 2, 4))
    s.bind(50)
    for doc in ([1, 2, 3], [4, 5, 6, 7], [8, 9]):
        s.add(doc)
    s.touch([0])
    path = tmp_path / "store.npz"
    s.save(path)
    assert not list(tmp_path.glob("*.tmp-*"))         # written beside, then renamed over
    r = SuffixStore.load(path, max_tokens=100)
    assert r.documents() == s.documents() == [[4, 5, 6, 7], [8, 9], [1, 2, 3]]
    assert (r.anchors, r.n_vocab) == (s.anchors, 50)
    assert SuffixStore.load(path, max_tokens=5).documents() == [[8, 9], [1, 2, 3]]   # the most recent fit
    ctx = [0, 5, 6]
    assert SuffixDrafter(50, r, ngram_max=4, ngram_min=1).tokens(ctx, 2) == [7]
    with pytest.raises(CacheFileError, match="vocabulary of 50 ids"):
        SuffixDrafter(60, r)


@pytest.mark.parametrize("content", [b"", b"not a zip at all", b"PK\x03\x04garbage"])
def test_a_corrupt_file_is_one_line(tmp_path, content):
    path = tmp_path / "bad.npz"
    path.write_bytes(content)
    with pytest.raises(CacheFileError) as e:
        SuffixStore.load(path)
    assert str(path) in str(e.value) and "\n" not in str(e.value)
    np.savez(tmp_path / "other.npz", tokens=np.zeros(3, np.int32))     # some other npz file
    with pytest.raises(CacheFileError):
        SuffixStore.load(tmp_path / "other.npz")


# ---- exactness ----------------------------------------------------------------------------------

def warmed(n_vocab: int, seed: int, n_docs: int = 3) -> SuffixStore:
    """A store holding a few random documents over the vocabulary (repetitive: short range)."""
    rng = np.random.default_rng(seed)
    store = SuffixStore(anchors=(1, 2, 4))
    for _ in range(n_docs):
        store.add(rng.integers(0, n_vocab, rng.integers(4, 30)).tolist())
    return store


@factories
@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 2**20), prompt=st.lists(st.integers(0, 7), min_size=1, max_size=10),
       relation=st.sampled_from(RELATIONS), use_eog=st.booleans())
def test_greedy_identity_with_the_suffix_drafter(factory, seed, prompt, relation, use_eog):
    target, draft = factory(8, seed, relation)
    eog = {7} if use_eog else set()
    want = generate_plain(target, prompt, 24, GREEDY, NumpyRandom(0), eog)
    store = warmed(8, seed)
    store.add(list(prompt) + want.ids)                # the answer itself, as an earlier request
    for draft_n in (1, 3, 16):
        for drafter, policy in (
                (SuffixDrafter(8, warmed(8, seed), ngram_max=3, ngram_min=1), Threshold(draft_n, 0.0)),
                (SuffixDrafter(8, store, ngram_max=4, ngram_min=1, copy_ratio=0), Threshold(draft_n, 0.0)),
                (SuffixDrafter(8, warmed(8, seed + 1), ngram_min=1), AdaptiveLength(n_max=draft_n)),
                (HybridDrafter(SuffixDrafter(8, warmed(8, seed), ngram_min=1), ModelDrafter(draft, GREEDY)),
                 AdaptiveLength(n_max=draft_n))):
            got = generate_speculative(target, drafter, prompt, 24, GREEDY, NumpyRandom(1), eog,
                                       policy=policy)
            assert got.ids == want.ids and got.stop_reason == want.stop_reason, draft_n
    answer = SuffixStore(anchors=(1, 2, 4))
    answer.add(list(prompt) + want.ids)
    got = generate_speculative(target, SuffixDrafter(8, answer, ngram_min=1, copy_ratio=0), prompt,
                               24, GREEDY, NumpyRandom(1), eog, policy=Threshold(8, 0.0))
    assert got.ids == want.ids
    if len(want.ids) > 2:                             # the stored answer is copied and accepted
        assert got.stats.n_accepted >= len(want.ids) // 2 and set(got.stats.by_drafter) == {"suffix"}


@factories
@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**20), n_vocab=st.integers(3, 4), data=st.data(),
       n_predict=st.integers(2, 3), draft_n=st.integers(1, 3), relation=st.sampled_from(RELATIONS),
       params=sampling_params, use_eog=st.booleans(), hybrid=st.booleans())
def test_exact_output_law_with_the_suffix_drafter(factory, seed, n_vocab, data, n_predict, draft_n,
                                                  relation, params, use_eog, hybrid):
    prompt = data.draw(st.lists(st.integers(0, n_vocab - 1), min_size=1, max_size=4))
    target, draft = factory(n_vocab, seed, relation)
    eog = {0} if use_eog else set()
    suffix = SuffixDrafter(n_vocab, warmed(n_vocab, seed), ngram_max=3, ngram_min=1)
    drafter = HybridDrafter(suffix, ModelDrafter(draft, params)) if hybrid else suffix

    def run(rng):
        res = generate_speculative(target, drafter, prompt, n_predict, params, rng, eog,
                                   policy=Threshold(draft_n, 0.0))
        return tuple(res.ids), res.stop_reason

    got, want = enumerate_outcomes(run), target_law(target, prompt, n_predict, params, eog)
    assert abs(sum(got.values()) - 1.0) < 1e-12
    for key in set(got) | set(want):
        assert abs(got.get(key, 0.0) - want.get(key, 0.0)) < 1e-9, key


def test_exact_output_law_longer_from_a_stored_answer():
    """5 tokens after a prompt whose continuation the store holds several times."""
    params = SamplerParams(temperature=0.9, top_k=0, top_p=1.0, min_p=0.0)
    target, _ = PAIR_FACTORIES["fake"](3, 5, "bad")
    store = SuffixStore(anchors=(1, 2))
    for doc in ([1, 2, 1, 0, 2, 2], [1, 2, 1, 0, 2, 1], [0, 1, 2, 1, 1]):
        store.add(doc)
    drafter = SuffixDrafter(3, store, ngram_max=3, ngram_min=1, copy_ratio=0)
    prompt = [2, 1, 2, 1]

    def run(rng):
        return tuple(generate_speculative(target, drafter, prompt, 5, params, rng, set(),
                                          policy=Threshold(4, 0.0)).ids)

    got = enumerate_outcomes(run)
    want = {k[0]: v for k, v in target_law(target, prompt, 5, params, set()).items()}
    assert set(got) == set(want)
    assert max(abs(got[k] - want[k]) for k in want) < 1e-9


def test_make_drafter_suffix_and_hybrid_over_the_store():
    class Target:                                     # what make_drafter reads of a Model
        class config:
            n_vocab = 12
        n_ctx = 64
    store = SuffixStore()
    d = make_drafter("suffix", Target, GREEDY, suffix_store=store, lookup_ngram_max=5)
    assert isinstance(d, SuffixDrafter) and d.store is store and d.ngram_max == 5
    assert isinstance(make_drafter("suffix", Target, GREEDY).store, SuffixStore)   # its own
    assert make_drafter("prompt-lookup", Target, GREEDY, suffix_store=store).__class__ is PromptLookupDrafter


# ---- wiring: API, CLI, chat, serve ---------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny(tiny_model):
    from synth import TinySpec
    return tiny_model(TinySpec(n_vocab=24, d_model=16, n_head=2, n_head_kv=1, d_ff=24, seed=3,
                               logit_scale=4.0))


def test_api_generate_with_a_store_warms_it_and_keeps_the_ids(tiny):
    store = SuffixStore()
    want = tiny.generate("abcab", n_predict=20, ignore_eos=True)
    first = tiny.generate("abcab", n_predict=20, ignore_eos=True, draft="suffix", suffix_store=store,
                          draft_policy="fixed", draft_n=8)
    assert first.ids == want.ids and store.documents() == [first.prompt_ids + first.ids]
    again = tiny.generate("abcab", n_predict=20, ignore_eos=True, draft="suffix", suffix_store=store,
                          draft_policy="fixed", draft_n=8)
    assert again.ids == want.ids and len(store) == 2
    assert again.stats.n_accepted >= len(want.ids) - again.stats.n_steps   # the stored answer, copied
    assert again.stats.n_accepted > first.stats.n_accepted
    own = SuffixDrafter(tiny.config.n_vocab, store)
    got = tiny.generate("abcab", n_predict=20, ignore_eos=True, draft=own, draft_policy="adaptive")
    assert got.ids == want.ids and len(store) == 3    # a SuffixDrafter's store is remembered in too
    hy = tiny.generate("abcab", n_predict=20, ignore_eos=True, draft="hybrid", draft_model=tiny,
                       suffix_store=store)
    assert hy.ids == want.ids                             # the defaults draft where rows pay:
    assert "suffix" in hy.stats.by_drafter or hy.stats.n_drafted == 0
    assert "suffix/" in hy.stats.plan                       # ... and the plan priced the store's keys
    with pytest.raises(ConfigError):
        tiny.generate("ab", n_predict=2, draft="suffix", suffix_store=[1, 2])


def test_cli_lookup_cache_round_trip_and_a_corrupt_file(tiny, tmp_path, capsys):
    from specdec.frontends import cli
    path = tmp_path / "cache.npz"
    args = ["run", "-m", tiny.path, "-p", "abcabcab", "-n", "8", "--ignore-eos", "--raw", "-v",
            "-lcd", str(path)]
    assert cli.main(args) == 0 and path.exists()      # -lcd alone drafts with the suffix drafter
    err = capsys.readouterr().err
    assert "suffix" in err and "lookup cache" not in err
    assert len(SuffixStore.load(path).documents()) == 1
    assert cli.main(args + ["--draft", "suffix", "--lookup-cache-size", "100"]) == 0
    assert "lookup cache" in capsys.readouterr().err and len(SuffixStore.load(path)) == 2
    path.write_bytes(b"\x00garbage")
    assert cli.main(args) == 2
    out = capsys.readouterr()
    lines = out.err.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0] and "loading" not in out.err
    assert path.read_bytes() == b"\x00garbage"        # left as it was
    assert cli.main(args[:-2] + ["--draft", "suffix", "--lookup-cache-size", "-3"]) == 2
    assert "--lookup-cache-size" in capsys.readouterr().err


def test_chat_turns_share_the_store(tiny_model):
    from synth import TinySpec
    from specdec.api.conversation import Conversation
    template = ("{% for m in messages %}{{ m['role'][0] | upper }}{{ m['content'] }}{% endfor %}"
                "{% if add_generation_prompt %}A{% endif %}")
    target = tiny_model(TinySpec(n_vocab=52, chat_template=template, n_ctx=256))
    store = SuffixStore()
    conv = Conversation(target, draft="suffix", suffix_store=store, draft_n=8, draft_policy="fixed",
                        ignore_eos=True)
    one = conv.say("hello", n_predict=16)
    assert store.documents() == [one.prompt_ids + one.ids]
    two = conv.say("again", n_predict=16)
    assert store.documents() == [two.prompt_ids + two.ids]   # the transcript replaced its turn-1 self
    conv.clear()
    three = conv.say("hello", n_predict=16)                  # drafts turn 1's answer from the store
    assert three.ids == one.ids and len(store) == 2
    assert three.stats.n_accepted >= len(one.ids) - three.stats.n_steps
    fresh = Conversation(target, draft="suffix", draft_n=8, draft_policy="fixed", ignore_eos=True)
    assert fresh.say("hello", n_predict=16).stats.n_accepted < three.stats.n_accepted
