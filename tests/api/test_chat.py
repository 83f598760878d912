"""Chat templates and conversations: the template renders as transformers / llama.cpp render
it, and a Conversation that keeps its KV caches across turns (and across Ctrl-C) gives exactly
what a fresh request with the same prompt gives, evaluating only the new tokens."""
from __future__ import annotations

import numpy as np
import pytest

import specdec
from specdec.api.conversation import CHATML, Conversation, chat_prompt, common_prefix, render
from specdec.errors import ChatTemplateError, ConfigError
from specdec.generation.plain import generate_plain
from specdec.generation.sampling import GREEDY, NumpyRandom, SamplerParams
from specdec.speculation.speculative import generate_speculative
from specdec.speculation.drafters import ModelDrafter
from synth import TinySpec

TEMPLATE = ("{% for m in messages %}{{ m['role'][0] | upper }}{{ m['content'] }}{% endfor %}"
            "{% if add_generation_prompt %}A{% endif %}")
# 52 single-letter tokens (EOS 'Z'): generated text tokenizes back to the same ids
TARGET = TinySpec(n_vocab=52, chat_template=TEMPLATE, n_ctx=256)
DRAFT = TinySpec(n_vocab=52, chat_template=TEMPLATE, n_ctx=256, seed=1, d_model=32, n_layer=1)
USER = [{"role": "user", "content": "hello"}]


# ---- rendering ------------------------------------------------------------------------------

def test_render_standard_variables_and_helpers():
    t = ("{{ bos_token }}{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}"
         "[{{ m.role }}:{{ m.content | tojson }}]{% endfor %}{% if add_generation_prompt %}>{% endif %}"
         "{{ eos_token }}")
    msgs = [{"role": "system", "content": "é"}, *USER, {"role": "assistant", "content": "x"}]
    assert render(t, msgs, bos_token="<s>", eos_token="</s>") == '<s>[system:"é"][user:"hello"]></s>'
    assert render(t, msgs, add_generation_prompt=False) == '[system:"é"][user:"hello"]'
    assert render(CHATML, USER) == "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"


def test_render_errors_are_one_line():
    with pytest.raises(ChatTemplateError, match="chat template: only user turns please$"):
        render("{{ raise_exception('only user turns\\nplease') }}", USER)
    with pytest.raises(ChatTemplateError, match="does not parse"):
        render("{% for %}", USER)
    with pytest.raises(ChatTemplateError, match="failed"):
        render("{{ messages[5]['content'] }}", USER)
    with pytest.raises(ConfigError, match="role must be one of"):
        render(CHATML, [{"role": "narrator", "content": "x"}])
    with pytest.raises(ConfigError, match="at least one message"):
        render(CHATML, [])


def test_sandbox_blocks_unsafe_templates():
    with pytest.raises(ChatTemplateError):
        render("{{ messages.__class__.__mro__ }}{% set x = messages.append(1) %}", USER)


def test_bos_written_by_the_template_is_not_doubled(tiny_model):
    tok = tiny_model(TinySpec(n_vocab=64)).tokenizer

    class AddsBos:                                    # the tokenizer's view that matters here
        chat_template = "{{ bos_token }}{{ messages[0]['content'] }}"
        bos_id, eos_id, tokens, add_bos = 0, 63, tok.tokens, True
    assert chat_prompt(AddsBos, USER) == "hello"
    AddsBos.add_bos = False
    assert chat_prompt(AddsBos, USER) == tok.tokens[0] + "hello"


def test_model_chat_prompt_uses_its_template_or_chatml(tiny_model):
    assert tiny_model(TARGET).chat_prompt(USER) == "UhelloA"
    assert tiny_model(TinySpec(n_vocab=64)).chat_prompt(USER).startswith("<|im_start|>user")


@pytest.mark.real
def test_real_template_renders_like_transformers(real_model):
    m = real_model("smollm2-135m-instruct-q4_1")
    got = m.chat_prompt([{"role": "system", "content": "Be brief."}, *USER])
    assert got == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhello<|im_end|>\n"
                   "<|im_start|>assistant\n")
    ids = m.tokenize(got)
    assert ids.count(m.tokenizer.token_to_id["<|im_start|>"]) == 3


# ---- resuming from a kept prefix -----------------------------------------------------------------

def test_n_keep_changes_nothing_but_the_work(tiny_model):
    target, draft = tiny_model(TARGET), tiny_model(DRAFT)
    prompt = list(range(2, 30))
    params = SamplerParams(temperature=0.9, top_k=0, top_p=1.0, min_p=0.0)
    for keep in (0, 5, 27, 28):
        s = target.session()
        s.eval(prompt[:max(keep, 1)])
        fresh = generate_plain(target.session(), prompt, 16, params, NumpyRandom(3), set())
        kept = generate_plain(s, prompt, 16, params, NumpyRandom(3), set(), n_keep=keep)
        assert kept.ids == fresh.ids
        s = target.session()
        s.eval(prompt[:max(keep, 1)])
        drafter = ModelDrafter(draft.session(), params, 0.0)
        fresh = generate_speculative(target.session(), ModelDrafter(draft.session(), params, 0.0),
                                     prompt, 16, params, NumpyRandom(4), set(), draft_n=3)
        kept = generate_speculative(s, drafter, prompt, 16, params, NumpyRandom(4), set(),
                                    draft_n=3, n_keep=keep)
        assert kept.ids == fresh.ids
    with pytest.raises(ValueError, match="n_keep"):
        generate_plain(target.session(), prompt, 4, GREEDY, NumpyRandom(0), set(), n_keep=3)


# ---- conversations ----------------------------------------------------------------------------

def _counting(session):
    """Wrap session.eval to count the tokens it evaluates."""
    real, seen = session.eval, []

    def ev(tokens, last_only=False):
        seen.append(len(tokens))
        return real(tokens, last_only)
    session.eval = ev
    return seen


@pytest.mark.parametrize("speculative", [False, True])
def test_turns_equal_fresh_requests_and_evaluate_only_the_delta(tiny_model, speculative):
    target = tiny_model(TARGET)
    kw = dict(draft=tiny_model(DRAFT), draft_n=3, draft_p=0.0) if speculative else {}
    conv = Conversation(target, system="be", **kw)
    seen = _counting(conv.target)
    for turn, text in enumerate(["hello", "again", "more"]):
        before = list(conv.messages)
        seen.clear()
        got = conv.say(text, n_predict=12)
        want = target.generate(target.chat_prompt([*before, {"role": "user", "content": text}]), 12)
        assert got.ids == want.ids and got.prompt_ids == want.prompt_ids
        if turn:
            new = len(got.prompt_ids) - conv.n_reused
            assert conv.n_reused > 0 and new < 12            # only the new turn was evaluated
            assert seen[0] == (new - 1 if speculative else new)
        assert conv.target.n_past == conv.n_cached
        assert conv.messages[-1] == {"role": "assistant", "content": got.text}


@pytest.mark.parametrize("speculative", [False, True])
@pytest.mark.parametrize("where", ["on_token", "eval_before", "eval_after"])
def test_ctrl_c_anywhere_leaves_a_consistent_cache(tiny_model, speculative, where):
    """KeyboardInterrupt at the k-th token / k-th target eval (before or after it ran): the
    conversation keeps the question and the shown part of the answer, the target cache holds
    exactly the rows a fresh evaluation of those tokens gives, and the next turn goes on."""
    target = tiny_model(TARGET)
    params = dict(temperature=0.7, top_k=0, top_p=1.0, min_p=0.0, seed=11, ignore_eos=True)
    kw = dict(draft=tiny_model(DRAFT), draft_n=4, draft_p=0.0) if speculative else {}
    for k in range(1, 7):
        conv = Conversation(target, **params, **kw)
        conv.say("hello", n_predict=5)
        calls, shown = [0], []

        def bomb():
            calls[0] += 1
            if calls[0] == k:
                raise KeyboardInterrupt

        def on_token(t, kind):
            if where == "on_token":
                bomb()
            shown.append(t)
        if where != "on_token":
            real = conv.target.eval

            def ev(tokens, last_only=False):
                if where == "eval_before":
                    bomb()
                out = real(tokens, last_only)
                if where == "eval_after":
                    bomb()
                return out
            conv.target.eval = ev
        try:
            conv.say("again", n_predict=10, on_token=on_token)
        except KeyboardInterrupt:
            pass
        conv.target.__dict__.pop("eval", None)
        assert conv.messages[-2]["content"] == "again"
        assert conv.messages[-1] == {"role": "assistant", "content": target.detokenize(shown)}
        n = conv.n_cached
        assert conv.target.n_past == n
        ids = target.tokenize(target.chat_prompt([*conv.messages, {"role": "user", "content": "more"}]))
        assert common_prefix(conv._ids, ids) == n                 # the cache is a prefix ...
        fresh = target.session()
        fresh.eval(conv._ids)
        assert np.array_equal(fresh.cache.keys()[:, :, :n], conv.target.cache.keys()[:, :, :n])  # ... of right rows
        assert np.array_equal(fresh.cache.v[:, :, :n], conv.target.cache.v[:, :, :n])
        assert conv.say("more", n_predict=8).prompt_ids == ids


def test_clear_and_context_overflow(tiny_model):
    conv = Conversation(tiny_model(TARGET), system="sys", n_ctx=40)
    conv.say("hello", n_predict=4)
    conv.clear()
    assert conv.messages == [{"role": "system", "content": "sys"}] and conv.n_cached == 0
    with pytest.raises(specdec.ContextOverflowError, match="no longer fits"):
        conv.say("x" * 60, n_predict=4)
    assert conv.say("hello", n_predict=4).stop_reason in ("n_predict", "eog")
