"""Property-test your own drafter with specdec.testing (pytest + hypothesis):

    pytest examples/test_my_drafter.py

`EchoDrafter` proposes the last context token again and again (a deterministic draft: q rows
one-hot).  check_drafter puts it through greedy identity and the exact output law on tiny
random models; the hypothesis property checks greedy identity on prompts it generates.
"""
import pytest
from hypothesis import given, settings

import specdec
from specdec import Draft, Drafter
from specdec.testing import assert_greedy_identical, check_drafter, strategies, tiny_model


class EchoDrafter(Drafter):
    source = "echo"

    def __init__(self, n_vocab: int):
        self.n_vocab = n_vocab

    def propose(self, context_ids, n_max, rng):
        return Draft.one_hot([context_ids[-1]] * n_max, self.n_vocab, self.source)


def test_echo_drafter_is_exact(tmp_path):
    check_drafter(lambda target: EchoDrafter(target.config.n_vocab), workdir=tmp_path)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return specdec.load(tiny_model(tmp_path_factory.mktemp("m") / "tiny.gguf", n_vocab=16))


@settings(max_examples=20, deadline=None)
@given(prompt=strategies.prompts(16))
def test_echo_greedy_identity(model, prompt):
    assert_greedy_identical(model, [prompt], 12, draft=EchoDrafter(16), draft_n=4, ignore_eos=True)
