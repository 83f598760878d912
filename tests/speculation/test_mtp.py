"""The MTP drafter (`--draft mtp`): a qwen35 target drafting with its own nextn block.

Its draft distribution q against a float64 restatement of llama.cpp's draft-mtp
(mtp_graph.py) and against llama.cpp's own MTP context on the same prefix
(llamacpp_mtp.py), each rule broken on purpose landing outside the bound; the drafter's
rollback (a drafted row is recomputed with the target's hidden state) and a wrong one caught;
greedy speculative == plain; the exact output law on a tiny vocabulary; --draft-vocab
trimming; the trace's source; refusal without nextn tensors."""
from __future__ import annotations

import numpy as np
import pytest

import specdec
from specdec.api.drafting import DraftPlan
from specdec.api.request import DraftOptions
from specdec.engine.transformer import eval_batch
from specdec.errors import ConfigError
from specdec.speculation.cost_model import PlannedLength
from specdec.generation.sampling import NumpyRandom, SamplerParams
from specdec.speculation.drafters import HybridDrafter, ModelDrafter, MTPDrafter, make_drafter
from specdec.testing import assert_greedy_identical, assert_same_law
from specdec.testing.synth_qwen35 import Qwen35Spec

import llamacpp_mtp
from mtp_graph import RULES, mtp_draft_logits

CONTEXT = [3, 17, 4, 40, 22, 9, 9, 31, 0, 45]
SOFT = SamplerParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
REF_BOUND = 1e-4        # |log q - log q_ref| against the float64 restatement (F32: ~2e-6 measured)
# against llama.cpp's own MTP, ~4-7x the gaps measured (F32 7e-4, the trunk's share; Q8_0 0.056:
# both round the matmul inputs to Q8_0, the house's Q8_0 logit bound, agreement/test_reference_synthetic.py)
LLAMA_BOUND = {"f32": 5e-3, "q8_0": 0.25}


@pytest.fixture(scope="module")
def q35(qwen35_file):
    """q35(Qwen35Spec(...)) -> (specdec.Model, path)."""
    return lambda spec: (specdec.load(qwen35_file(spec), n_ctx=128), qwen35_file(spec))


def _spec(**kw) -> Qwen35Spec:
    return Qwen35Spec(**{"seed": 4, "nextn": True, "merges": ("a a",), **kw})


def _lsm(z):
    z = np.asarray(z, np.float64)
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def _draft(model, context, n, params=SOFT, seed=0, **kw):
    """(drafter, target session, Draft) after the prompt phase on context, as the
    speculative loop runs it."""
    target = model.session(128)
    drafter = make_drafter("mtp", model, params, n_ctx=128, **kw)
    drafter.reset()
    drafter.attach(target)
    target.eval(context[:-1], last_only=True)
    drafter.prefill(context)
    return drafter, target, drafter.propose(context, n, NumpyRandom(seed))


def _gap(q_rows, logits_rows):
    return float(np.abs(np.log(np.maximum(q_rows, 1e-300)) - _lsm(logits_rows)).max())


@pytest.mark.parametrize("head_norm", [False, True])
def test_draft_q_follows_the_float64_restatement(q35, head_norm):
    """q_i = softmax of the MTP logits llama.cpp's graph gives for draft i (rows paired with
    the target's hidden state at t-1, drafts chained on the block's own h'); every rule
    broken on purpose lands outside the bound."""
    m, _ = q35(_spec(nextn_head_norm=head_norm))
    _, _, d = _draft(m, CONTEXT, 4)
    assert len(d.tokens) == 4 and d.source == "mtp"
    want = mtp_draft_logits(m.gguf, CONTEXT, d.tokens[:-1])
    assert _gap(d.q, want) <= REF_BOUND
    for rule in RULES:
        if rule == "head_norm" and not head_norm:
            continue
        assert _gap(d.q, mtp_draft_logits(m.gguf, CONTEXT, d.tokens[:-1], (rule,))) > 100 * REF_BOUND, rule


@pytest.mark.parametrize("quant", ["f32", "q8_0"])
def test_draft_follows_llamacpp_mtp(q35, quant):
    """Against llama.cpp's own MTP context (LLAMA_CONTEXT_TYPE_MTP, driven as draft-mtp drives
    it) on the same prefix and drafted tokens; the broken rules (restated) land outside the
    bound."""
    why = llamacpp_mtp.available()
    if why:
        pytest.skip(why)
    qtype = {"f32": 0, "q8_0": 8}[quant]
    m, path = q35(_spec(nextn_head_norm=True, qtype=qtype))
    _, _, d = _draft(m, CONTEXT, 3)
    theirs = llamacpp_mtp.mtp_draft_logits(path, CONTEXT, d.tokens[:-1])
    assert _gap(d.q, theirs[:3]) <= LLAMA_BOUND[quant]
    if quant != "f32":
        return                              # the float64 restatement reads F32 files only
    for rule in RULES:
        wrong = mtp_draft_logits(m.gguf, CONTEXT, d.tokens[:-1], (rule,))
        assert np.abs(_lsm(wrong) - _lsm(theirs)).max() > 2 * LLAMA_BOUND[quant], rule


def test_rollback_recomputes_drafted_rows(q35, monkeypatch):
    """After a step, the next draft is the restatement's on the longer context: the rows the
    draft chained on the block's own h' were recomputed with the target's.  Keeping them (a
    wrong rollback) is caught."""
    m, _ = q35(_spec())

    def next_gap():
        drafter, target, d = _draft(m, CONTEXT, 4)
        logits = target.eval([CONTEXT[-1], *d.tokens])          # the verification pass
        n_acc = 3                                               # accept 3, then a correction
        nxt = int(np.argmax(logits[n_acc]))
        target.truncate(target.n_past - (len(d.tokens) - n_acc))
        drafter.accept(n_acc, nxt)
        ctx = [*CONTEXT, *d.tokens[:n_acc], nxt]
        d2 = drafter.propose(ctx, 3, NumpyRandom(1))
        return _gap(d2.q, mtp_draft_logits(m.gguf, ctx, d2.tokens[:-1]))
    assert next_gap() <= REF_BOUND
    monkeypatch.setattr(MTPDrafter, "propose", ModelDrafter.propose)    # a draft model's rollback
    assert next_gap() > 100 * REF_BOUND


@pytest.mark.parametrize("n", [1, 3, 6])
def test_greedy_speculative_equals_plain(q35, n):
    m, _ = q35(_spec())
    prompts = [CONTEXT, [1, 2, 3], [7] * 12]
    assert_greedy_identical(m, prompts, 20, draft="mtp", draft_n=n, ignore_eos=True)
    assert_greedy_identical(m, prompts, 20, draft="mtp", ignore_eos=True)          # the defaults


def test_output_law_is_the_targets(q35):
    """The exact law of the next tokens on a tiny vocabulary, every branch enumerated."""
    m, _ = q35(_spec(n_vocab=5, d_model=32, d_head=16, d_ff=48, rope_dim=8, d_state=8))
    for n in (1, 2):
        assert_same_law(m, [1, 2, 3, 1], 2, temperature=0.9, ignore_eos=True, draft="mtp",
                        draft_n=n, draft_policy="fixed")


def test_trimmed_head_q_lives_on_the_kept_ids(q35):
    m, _ = q35(_spec())
    _, _, d = _draft(m, CONTEXT, 3, draft_vocab=20)
    assert np.all(d.q[:, 20:] == 0.0) and np.allclose(d.q.sum(1), 1.0)
    want = mtp_draft_logits(m.gguf, CONTEXT, d.tokens[:-1])[:, :20]
    assert _gap(d.q[:, :20], want) <= REF_BOUND


def test_trace_and_stats_name_mtp(q35):
    m, _ = q35(_spec())
    out = m.generate(CONTEXT, 12, temperature=0.0, draft="mtp", draft_n=3, ignore_eos=True)
    assert set(out.stats.by_drafter) == {"mtp"}


def test_refused_without_nextn(q35):
    m, _ = q35(_spec(nextn=False))
    with pytest.raises(ConfigError, match="nextn"):
        make_drafter("mtp", m, SOFT, n_ctx=64)
    with pytest.raises(ConfigError, match="--draft mtp"):
        DraftOptions(kind="mtp").with_target(m)                  # the CLI and server, at start-up


def test_the_defaults_draft_with_the_mtp_head(q35):
    """No -md, no --draft: a target with an MTP head drafts with it (hybrid: lookup, else the
    head), planned by the cost model with the head's step priced; greedy output unchanged."""
    m, _ = q35(_spec())
    options = DraftOptions().with_target(m)
    assert options.mtp and options.enabled and options.drafter_kind == "hybrid"
    assert not DraftOptions().with_target(q35(_spec(nextn=False))[0]).enabled
    drafter, _ = options.build(m, SOFT, 128)
    assert isinstance(drafter, HybridDrafter) and isinstance(drafter.model, MTPDrafter)
    plan = DraftPlan(options, m)
    costs = plan.costs()
    assert costs.draft is not None and 0 < costs.c < 1
    assert_greedy_identical(m, [CONTEXT, [5] * 9], 20, draft=options, ignore_eos=True)
    out = m.generate(CONTEXT, 30, temperature=0.0, draft=options, ignore_eos=True)
    assert out.stats.plan.startswith("plan: ") and set(out.stats.by_drafter) <= {"prompt-lookup", "mtp"}
    assert "MTP head" in out.stats.plan                          # the reasons name the head
    assert PlannedLength.kind("mtp") == "model"                  # its steps priced at its own cost


def test_under_load_the_head_is_capped_as_a_free_drafter(q35):
    """In a batch the server caps a greedy request's draft length by batch size: a draft
    model's table (0 from 2 requests on) or the free drafters' (4 at 2): the head's steps
    take the free one (its step ~0.06 of a pass), a draft model's keep theirs."""
    from specdec.api.drafting import Load
    m, _ = q35(_spec())
    options = DraftOptions(kind="mtp").with_target(m)
    capped = []
    load = Load(lambda free: 4 if free else 0, lambda: capped.append(1))
    plan = DraftPlan(options, m)
    _, policy = plan.request(options.build(m, SOFT, 128), prompt_len=len(CONTEXT), n_predict=30, greedy=True,
                             seeded=False, n_vocab=m.config.n_vocab, load=load)
    assert policy.cap("mtp") == 4 and policy.cap("model") == 0 and policy.cap(None) == 0


def test_hidden_rows_are_kept_by_position_alone_and_batched(q35):
    """The target keeps each pass's hidden rows at their positions (what the head reads), the
    same bits alone and in a batch with another session; a truncation keeps what stays."""
    m, _ = q35(_spec())
    solo = m.session(64)
    solo.keep_hidden = True
    solo.eval(CONTEXT + [5, 6, 7])
    want = solo.last_hidden
    a, b = m.session(64), m.session(64)
    a.keep_hidden = b.keep_hidden = True
    eval_batch([a, b], [CONTEXT, [1, 2, 3]], last_only=[True, False])
    a.truncate(len(CONTEXT) - 2)
    a.eval(CONTEXT[-2:])
    eval_batch([b, a], [[4], [5, 6, 7]])
    n = len(CONTEXT) + 3
    assert a.hidden_from == 0 and a.n_past == n
    assert np.array_equal(a.hidden_rows[:n], want)
    plain = m.session(64)
    plain.eval(CONTEXT)
    assert plain.hidden_rows is None and plain.last_hidden is None


def test_conversation_turns_equal_fresh_requests(q35):
    """A conversation keeps the target's rows, its hidden rows and the head's cache across
    turns (n_keep > 0: the drafter is not reset); each turn equals a fresh request."""
    template = ("{% for m in messages %}{{ m['role'][0] | upper }}{{ m['content'] }}{% endfor %}"
                "{% if add_generation_prompt %}A{% endif %}")
    m, _ = q35(_spec(n_vocab=52, seed=9, chat_template=template, logit_scale=3.0))
    for kw in (dict(draft="mtp", draft_n=3), {}):
        conv = specdec.Conversation(m, system="be", **kw)
        for text in ("hello", "again", "more"):
            before = list(conv.messages)
            got = conv.say(text, n_predict=10)
            want = m.generate(m.chat_prompt([*before, {"role": "user", "content": text}]), 10)
            assert got.ids == want.ids


def test_qwen35moe_head_drafts_exactly(q35):
    """A qwen35moe file's MTP block (experts in its FFN): greedy speculative == plain."""
    m, _ = q35(_spec(n_expert=8, n_expert_used=3, d_ff_exp=64))
    assert m.config.arch == "qwen35moe" and m.weights.mtp is not None
    assert_greedy_identical(m, [CONTEXT, [4] * 8], 16, draft="mtp", draft_n=3, ignore_eos=True)
