"""Greedy speculative == greedy plain on the real Qwen pair, token for token, for the
reference prompts (128 new tokens each).  SPECDEC_SPEC_PROMPTS=k limits it to the first k."""
from __future__ import annotations

import json
import os

import pytest

from helpers import REFERENCE

TARGET, DRAFT = "qwen2.5-coder-1.5b-instruct-q4_k_m", "qwen2.5-coder-0.5b-instruct"
PROMPTS = [json.loads(l)["prompt"] for l in open(REFERENCE / "llamacpp.jsonl", encoding="utf-8")
           if json.loads(l).get("kind") == "greedy" and json.loads(l)["model"] == TARGET]
PROMPTS = PROMPTS[: int(os.environ.get("SPECDEC_SPEC_PROMPTS", len(PROMPTS)))]


@pytest.mark.real
@pytest.mark.parametrize("i", range(len(PROMPTS)))
def test_greedy_speculative_identical_on_qwen_pair(real_model, i):
    target, draft = real_model(TARGET), real_model(DRAFT)
    plain = target.generate(PROMPTS[i], n_predict=128, ignore_eos=True)
    spec = target.generate(PROMPTS[i], n_predict=128, ignore_eos=True, draft=draft, draft_n=5, draft_p=0.9)
    s = spec.stats
    print(f"\nprompt {i}: identical={plain.ids == spec.ids}, accepted {s.n_accepted}/{s.n_drafted}, "
          f"{s.tokens_per_step:.2f} tokens/step, plain {plain.timings.tokens_per_s:.1f} tok/s, "
          f"spec {spec.timings.tokens_per_s:.1f} tok/s")
    assert spec.ids == plain.ids
    assert len(spec.ids) == 128


@pytest.mark.real
def test_incompatible_pair_refused(real_model):
    import specdec
    with pytest.raises(specdec.IncompatibleDraftError) as e:
        real_model(TARGET).generate("hi", n_predict=2, draft=real_model("smollm2-135m-instruct-q4_1"))
    msg = str(e.value)
    assert "\n" not in msg and "vocab size 151936 vs 49152" in msg and "token texts differ" in msg
