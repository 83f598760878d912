"""qwen35 (Qwen3.5's hybrid of Gated DeltaNet and gated attention) against a float64
restatement of llama.cpp's graph (qwen35_graph.py), and the exactness of its recurrent state:
a verification pass rolled back to any prefix is bitwise the state of one-row steps, a wrong
rollback is caught, a truncation before the last pass re-evaluates, batches and
conversations give the same bits, greedy speculation equals plain decoding."""
from __future__ import annotations

import numpy as np
import pytest

import specdec
from specdec.engine import recurrent
from specdec.engine.gguf_file import GGUFFile
from specdec.engine.kv_cache import KVCache
from specdec.engine.qwen35 import mtp_forward
from specdec.engine.transformer import eval_batch
from specdec.errors import UnsupportedModelError
from specdec.testing import assert_greedy_identical
from specdec.testing.synth_qwen35 import Qwen35Spec, write_qwen35_model

from qwen35_graph import RULES, _attention, qwen35_forward, rope_mask

TOKENS = [3, 17, 4, 40, 22, 9, 9, 31, 0, 45, 12, 7, 30, 2]
TEMPLATE = ("{% for m in messages %}{{ m['role'][0] | upper }}{{ m['content'] }}{% endfor %}"
            "{% if add_generation_prompt %}A{% endif %}")


@pytest.fixture(scope="module")
def q35(qwen35_file):
    """q35(Qwen35Spec(...)) -> specdec.Model."""
    return lambda spec=None, n_ctx=128: specdec.load(qwen35_file(spec or Qwen35Spec()), n_ctx=n_ctx)


def _close(a, b, tol=1e-4):
    return np.abs(a - b).max() <= tol * max(1.0, np.abs(b).max())


@pytest.mark.parametrize("nextn", [False, True])
def test_forward_and_hidden_follow_llamacpp_graph(q35, nextn):
    m = q35(Qwen35Spec(seed=3, nextn=nextn))
    s = m.session(64)
    s.keep_hidden = True
    ours = s.eval(TOKENS).astype(np.float64)
    logits, hidden = qwen35_forward(m.gguf, TOKENS)
    assert _close(ours, logits) and _close(s.last_hidden, hidden)
    assert m.config.n_layer == 4 and m.config.recurrent == (True, True, True, False)
    assert (m.weights.mtp is not None) == nextn


def test_each_rule_matters(q35):
    """Each rule broken on purpose moves the reference far from ours: all are exercised."""
    m = q35(Qwen35Spec(seed=3))
    ours = m.session(64).eval(TOKENS).astype(np.float64)
    for rule in RULES:
        assert not _close(ours, qwen35_forward(m.gguf, TOKENS, (rule,))[0], 1e-2), rule


def test_mtp_block_follows_llamacpp_graph(q35):
    """mtp_forward against graph_mtp restated: e = rms(embd)·enorm, h = rms(hidden)·hnorm,
    x = [e | h]·eh_proj, the gated attention block, rms(x)·shared_head_norm, the head."""
    m = q35(Qwen35Spec(seed=4, nextn=True, nextn_head_norm=True))
    cfg, gf = m.config, m.gguf
    rng = np.random.default_rng(0)
    hid = rng.standard_normal((5, cfg.d_model)).astype(np.float32)
    toks = np.array([5, 9, 1, 33, 2])
    cache = KVCache(1, cfg.n_head_kv, 32, cfg.d_head)
    logits, h_next = mtp_forward(cfg, m.weights.mtp, cache, toks, hid, 0)

    def t(name):
        return gf.tensor(name).astype(np.float64)

    def rms(x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + cfg.norm_eps) * w
    b = f"blk.{cfg.n_layer}."
    x = np.concatenate([rms(t("token_embd.weight")[toks], t(b + "nextn.enorm.weight")),
                        rms(hid.astype(np.float64), t(b + "nextn.hnorm.weight"))], axis=1)
    x = x @ t(b + "nextn.eh_proj.weight").T
    mask = rope_mask(cfg.rope_dim, cfg.rope_sections)
    x = x + _attention(t, b, rms(x, t(b + "attn_norm.weight")), np.arange(5), cfg.n_head, cfg.n_head_kv,
                       cfg.d_head, cfg.rope_dim, cfg.rope_base, mask, cfg.norm_eps, (), rms,
                       lambda z: 1 / (1 + np.exp(-z)))
    h2 = rms(x, t(b + "post_attention_norm.weight"))
    silu = h2 @ t(b + "ffn_gate.weight").T
    x = x + (silu / (1 + np.exp(-silu)) * (h2 @ t(b + "ffn_up.weight").T)) @ t(b + "ffn_down.weight").T
    want_h = rms(x, t(b + "nextn.shared_head_norm.weight"))
    assert _close(h_next, want_h) and _close(logits, want_h @ t("output.weight").T)
    assert cache.n_past == 5


def _snapshot(s) -> tuple:
    """Everything a session's cache holds that later passes read."""
    c, n = s.cache, s.n_past
    return (n, c.rec.conv.copy(), c.rec.cur.copy(), c.keys()[:, :, :n].copy(), c.v[:, :, :n].copy())


def _same(a: tuple, b: tuple) -> bool:
    return a[0] == b[0] and all(np.array_equal(x, y) for x, y in zip(a[1:], b[1:]))


def _rollbacks_exact(m, prompt, rows, lead=()) -> bool:
    """A pass over `rows` after the prompt (and `lead`, fed one row at a time), truncated to
    each prefix, holds bitwise the state of one-row steps over that prefix, and the next
    row's logits agree."""
    lead = list(lead)
    steps = m.session(64)
    steps.eval(prompt)
    for t in lead:
        steps.eval([t])
    want = [_snapshot(steps)]
    for t in rows:
        steps.eval([t])
        want.append(_snapshot(steps))
    for k in range(len(rows) + 1):
        s = m.session(64)
        s.eval(prompt)
        for t in lead:
            s.eval([t])
        s.eval(rows)
        s.truncate(len(prompt) + len(lead) + k)
        if not _same(_snapshot(s), want[k]):
            return False
        again = m.session(64)
        again.eval(prompt + lead + rows[:k])
        if not np.array_equal(s.eval([rows[-1]]), again.eval([rows[-1]])):
            return False
    return True


def test_rollback_to_any_prefix_is_one_row_steps_bitwise(q35):
    assert _rollbacks_exact(q35(Qwen35Spec(seed=5)), TOKENS[:6], [11, 2, 40, 7, 7, 19, 3])


@pytest.mark.parametrize("n_lead", [2, recurrent.REPLAY_MAX + 3])
def test_a_verification_pass_after_one_row_steps_rolls_back_bitwise(q35, n_lead):
    """One-row steps, then a pass of several rows (a verification pass): the base state first
    settles at the pass's start, by replaying the few logged rows or by copying the state
    after more of them, and rolling the pass back to any prefix is still one-row steps."""
    lead = [3, 9, 4, 8, 30, 12, 5][:n_lead]
    assert _rollbacks_exact(q35(Qwen35Spec(seed=5)), TOKENS[:6], [11, 2, 40, 7, 19], lead=lead)


def test_a_wrong_settle_is_caught(q35, monkeypatch):
    """Settling the base state one row short (the copy taken but the position not moved)."""
    def short(self):
        self.base[...] = self.cur
        self.conv0[...] = self.conv
        self.start += self.log.m - 1
        self.log.m = 1
    monkeypatch.setattr(recurrent.RecurrentState, "settle", short)
    assert not _rollbacks_exact(q35(Qwen35Spec(seed=5)), TOKENS[:6], [11, 2, 40, 7, 19], lead=[3, 9, 4, 8, 30, 12])


def test_a_wrong_rollback_is_caught(q35, monkeypatch):
    """Replaying one row too many (or not at all) is seen by the check above."""
    m = q35(Qwen35Spec(seed=5))
    real = recurrent.RecurrentState.replay
    monkeypatch.setattr(recurrent.RecurrentState, "replay", lambda self, r: real(self, min(r + 1, self.log.m)))
    assert not _rollbacks_exact(m, TOKENS[:6], [11, 2, 40, 7])
    monkeypatch.setattr(recurrent.RecurrentState, "replay", lambda self, r: None)
    assert not _rollbacks_exact(m, TOKENS[:6], [11, 2, 40, 7])


def test_truncating_passes_back_replays_and_before_the_log_evaluates_again(q35):
    """Several one-row passes back (a draft model's cache after its draft): replayed from the
    log; past the base state: re-evaluated from position 0.  Both bitwise."""
    m = q35(Qwen35Spec(seed=5))
    ids = (TOKENS * 8)[:recurrent.WINDOW + 20]
    s = m.session(128)
    s.eval(ids[:8])
    for t in ids[8:]:                                 # one row at a time: the base moves on
        s.eval([t])
    rec = s.cache.rec
    assert rec.start > 0 and s.n_past - rec.start >= recurrent.KEEP
    for n in (s.n_past - 3, rec.start, rec.start - 1, 5):
        s.truncate(n)
        assert rec.stale == (n if n < rec.start else 0)
        fresh = m.session(128)
        fresh.eval(ids[:n])
        assert np.array_equal(s.eval(ids[n:n + 2]), fresh.eval(ids[n:n + 2]))
        assert _same(_snapshot(s), _snapshot(fresh))


def test_a_pass_interrupted_between_layers_is_undone(q35, monkeypatch):
    """KeyboardInterrupt in the middle of a pass: the next pass starts from the state before it."""
    import specdec.engine.qwen35 as qwen35_mod
    m = q35(Qwen35Spec(seed=5))
    s = m.session(64)
    s.eval(TOKENS[:6])
    real, calls = qwen35_mod.deltanet, [0]

    def bomb(*a):
        calls[0] += 1
        if calls[0] == 2:
            raise KeyboardInterrupt
        return real(*a)
    monkeypatch.setattr(qwen35_mod, "deltanet", bomb)
    with pytest.raises(KeyboardInterrupt):
        s.eval(TOKENS[6:9])
    monkeypatch.undo()
    assert s.n_past == 6
    fresh = m.session(64)
    fresh.eval(TOKENS[:6])
    assert np.array_equal(s.eval(TOKENS[6:10]), fresh.eval(TOKENS[6:10]))


def test_rows_and_batches_are_independent(q35):
    """A prompt in one pass equals its rows one by one; eval_batch equals each alone."""
    m = q35(Qwen35Spec(seed=6))
    whole = m.session(64).eval(TOKENS)
    s = m.session(64)
    assert np.array_equal(whole, np.concatenate([s.eval([t]) for t in TOKENS]))
    prompts = [TOKENS[:3], TOKENS[2:12], TOKENS[5:6]]
    alone = [m.session(64).eval(p) for p in prompts]
    sessions = [m.session(64) for _ in prompts]
    for a, b in zip(alone, eval_batch(sessions, prompts)):
        assert np.array_equal(a, b)
    for s, p in zip(sessions, prompts):           # and the next step from each state
        assert np.array_equal(s.eval([1]), (lambda o: (o.eval(p), o.eval([1]))[1])(m.session(64)))
    long = (TOKENS * 12)[:150]                     # more than UBATCH rows: passes of 128, then 22
    a, b = m.session(200), m.session(200)
    assert np.array_equal(a.eval(long), np.concatenate([b.eval(long[:100]), b.eval(long[100:])]))
    assert _same(_snapshot(a), _snapshot(b))


@pytest.mark.parametrize("draft", ["model", "prompt-lookup"])
def test_greedy_speculative_equals_plain(q35, draft):
    target = q35(Qwen35Spec(seed=7, logit_scale=3.0))
    kw = dict(draft=q35(Qwen35Spec(seed=8, logit_scale=3.0))) if draft == "model" else dict(draft=draft)
    prompts = [TOKENS[:5], [1, 2, 1, 2, 1, 2, 1], TOKENS]
    for n in (1, 3, 5):
        assert_greedy_identical(target, prompts, 16, draft_n=n, ignore_eos=True, **kw)


def test_conversation_reuses_and_truncates_the_state(q35):
    """Turns of a conversation equal fresh requests (the recurrent state cut back to the
    kept rows, rebuilt where that lies before the last pass)."""
    spec = Qwen35Spec(n_vocab=52, seed=9, chat_template=TEMPLATE, logit_scale=3.0)
    target = q35(spec, n_ctx=256)
    for kw in ({}, dict(draft=q35(Qwen35Spec(n_vocab=52, seed=10, chat_template=TEMPLATE)), draft_n=3)):
        conv = specdec.Conversation(target, system="be", **kw)
        for text in ("hello", "again", "more"):
            before = list(conv.messages)
            got = conv.say(text, n_predict=10)
            want = target.generate(target.chat_prompt([*before, {"role": "user", "content": text}]), 10)
            assert got.ids == want.ids
            assert conv.target.n_past == conv.n_cached


def test_trees_and_unknown_tensors_are_refused(q35, tmp_path):
    m = q35(Qwen35Spec(seed=3))
    s = m.session(64)
    s.eval(TOKENS[:3])
    with pytest.raises(UnsupportedModelError, match="tree"):
        s.eval_tree([1, 2], [-1, 0])
    for name in ("blk.0.ssm_d.weight", "blk.4.nextn.pre_projection.weight"):
        with pytest.raises(UnsupportedModelError, match=name.replace(".", "[.]")):
            q35(Qwen35Spec(seed=3, nextn=True, extra_tensors=(name,)))
    import gguf
    path = write_qwen35_model(tmp_path / "x.gguf", Qwen35Spec(seed=3))
    r = gguf.GGUFReader(path)
    assert "blk.0.ssm_a" in {t.name for t in r.tensors}
    assert GGUFFile(path).get("qwen35.full_attention_interval") == 4


def test_qwen35moe_rolls_back_and_batches_exactly(q35):
    """qwen35moe (experts and the gated shared expert in each FFN): the same exactness."""
    spec = Qwen35Spec(seed=11, n_expert=4, n_expert_used=2, d_ff_exp=32, nextn=True)
    m = q35(spec)
    assert m.config.is_moe and m.config.d_ff_shexp == spec.d_ff and m.weights.layers[0].shared is not None
    assert m.weights.mtp.layer.moe is not None
    assert _rollbacks_exact(m, TOKENS[:6], [11, 2, 40, 7, 19])
    prompts = [TOKENS[:3], TOKENS[2:12]]
    alone = [m.session(64).eval(p) for p in prompts]
    for a, b in zip(alone, eval_batch([m.session(64) for _ in prompts], prompts)):
        assert np.array_equal(a, b)
    assert_greedy_identical(m, [TOKENS[:5]], 12, draft="prompt-lookup", draft_n=3, ignore_eos=True)


def test_output_law_is_plain_law(q35, monkeypatch):
    """The enumerated law of the next tokens on a tiny vocabulary: speculative (a qwen35 draft
    model, rejections rolling the recurrent state back) == plain; with a rollback that
    replays one row too many, the laws differ."""
    from specdec.testing import assert_same_law
    target = q35(Qwen35Spec(n_vocab=5, seed=12, logit_scale=2.0))
    draft = q35(Qwen35Spec(n_vocab=5, seed=13, logit_scale=2.0))
    kw = dict(temperature=1.0, ignore_eos=True, draft=draft, draft_policy="fixed")
    for n in (1, 2):
        assert_same_law(target, [1, 2], 3, draft_n=n, **kw)
    real = recurrent.RecurrentState.replay
    monkeypatch.setattr(recurrent.RecurrentState, "replay", lambda self, r: real(self, min(r + 1, self.log.m)))
    with pytest.raises(AssertionError, match="law"):
        assert_same_law(target, [1, 2], 3, draft_n=2, **kw)
