"""`specdec check`: greedy identity and the sampled first-token test on tiny models, the
report of a divergence, the chi-square test's verdicts, exit codes."""
from __future__ import annotations

import json

import numpy as np
import pytest

from specdec.frontends import check, cli


@pytest.fixture(scope="module")
def tiny(tiny_model):
    from synth import TinySpec
    return tiny_model(TinySpec(n_vocab=24, d_model=16, n_head=2, n_head_kv=1, d_ff=24, seed=3,
                               logit_scale=4.0))


def test_greedy_check_on_prompts_file(tiny, tmp_path, capsys):
    f = tmp_path / "prompts.jsonl"
    f.write_text(json.dumps({"prompt": "abcab"}) + "\n"
                 + json.dumps({"messages": [{"role": "user", "content": "cab"}]}) + "\n")
    base = ["check", "-m", tiny.path, "-n", "16", "--ignore-eos"]
    assert cli.main(base + ["-f", str(f), "--draft", "prompt-lookup"]) == 0
    out = capsys.readouterr().out
    assert out.count("identical (16 tokens)") == 2 and "2/2 identical" in out
    t = tmp_path / "p.txt"
    t.write_text("abc\n\nbca\n")
    assert cli.main(base + ["-f", str(t), "--raw", "-md", tiny.path]) == 0
    assert "2/2 identical" in capsys.readouterr().out


def test_sampled_check(tiny, capsys):
    assert cli.main(["check", "-m", tiny.path, "-p", "abcab", "--raw", "--temp", "1.0", "--top-k", "0",
                     "--top-p", "1", "--min-p", "0", "--samples", "80", "-md", tiny.path, "-s", "5"]) == 0
    out = capsys.readouterr().out
    assert "consistent at alpha 0.01" in out and "1/1 consistent" in out


class _Diverging:
    """A 'target' whose speculative run parts from the plain one at token 3."""
    def generate(self, ids, n, draft=None, **kw):
        class R:
            pass
        r = R()
        r.ids = [1, 2, 3, 4, 5] if draft is None else [1, 2, 3, 9, 5]
        return r

    def logits(self, ids):
        out = np.zeros((len(ids), 10), np.float32)
        out[-1, 4], out[-1, 9] = 2.0, 1.5
        return out

    def detokenize(self, ids):
        return "".join(chr(97 + i) for i in ids)


def test_a_divergence_is_reported_with_the_margin():
    r = check.check_greedy(_Diverging(), [7], 5, draft="x", index=1)
    assert not r.identical and r.position == 3 and (r.plain, r.speculative) == ("e", "j")
    assert r.margin == pytest.approx(0.5)
    assert check.first_divergence([1, 2], [1, 2, 3]) == 2 and check.first_divergence([1], [1]) is None


def test_chi2_flags_a_wrong_law_and_passes_the_right_one():
    rng = np.random.default_rng(0)
    p = np.array([0.5, 0.3, 0.15, 0.05])
    right = rng.multinomial(400, p)
    wrong = rng.multinomial(400, [0.35, 0.45, 0.15, 0.05])       # mass moved from the top token
    assert check.chi2_test(right, p, 0.05, 0.01, rng)[2] > 0.01
    bins, x2, pv, power = check.chi2_test(wrong, p, 0.15, 0.01, rng)
    assert pv < 0.01 and power > 0.9 and bins == 4
    assert check.chi2_test(np.array([10, 0]), np.array([1.0, 0.0]), 0.05, 0.01, rng)[2] == 1.0


def test_bad_input_exits_2(tiny, tmp_path, capsys):
    base = ["check", "-m", tiny.path]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": 1}\n')
    for args in ([], ["-p", "x"], ["-p", "x", "-f", str(bad), "--draft", "prompt-lookup"],
                 ["-f", str(bad), "--draft", "prompt-lookup"], ["-f", str(tmp_path / "none.txt"), "--draft", "suffix"],
                 ["-p", "x", "--draft", "prompt-lookup", "--alpha", "2"]):
        assert cli.main(base + args) == 2, args
        assert capsys.readouterr().err.strip().splitlines()[-1].startswith("specdec: error:")
