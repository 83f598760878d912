"""Can this draft model speak for this target?  The vocabulary check of llama.cpp's
common_speculative_are_compatible, reported as one line that says everything that differs.

A draft of another vocabulary can still draft through text (drafters/retok.py), but only when
that is asked for: `check_compatible(..., retokenize=True)`, the --draft-retokenize flag."""
from __future__ import annotations

from ..errors import IncompatibleDraftError

VOCAB_MAX_SIZE_DIFFERENCE = 128   # llama.cpp SPEC_VOCAB_MAX_SIZE_DIFFERENCE
VOCAB_CHECK_START_TOKEN_ID = 5    # llama.cpp SPEC_VOCAB_CHECK_START_TOKEN_ID
_SHOWN = 3                        # differing token ids quoted in the message


def vocab_differences(target, draft) -> list[str]:
    """Every way the two tokenizers differ that would break exact speculation.

    target, draft: specdec.text.tokenizer.Tokenizer (vocab_type, bos_id, eos_id, add_bos, add_eos,
    tokens).  A pair llama.cpp accepts passes: a BOS or EOS id that neither side adds may
    differ (an instruct target's end of turn beside a base draft's), as there."""
    diffs = []
    if target.vocab_type != draft.vocab_type:
        diffs.append(f"vocab type {target.vocab_type!r} vs {draft.vocab_type!r}")
    # BOS / EOS as llama.cpp compares them: the add flags, and the id only where it is added
    for kind in ("bos", "eos"):
        add_t, add_d = getattr(target, f"add_{kind}"), getattr(draft, f"add_{kind}")
        id_t, id_d = getattr(target, f"{kind}_id"), getattr(draft, f"{kind}_id")
        if add_t != add_d:
            diffs.append(f"add-{kind.upper()} flag {add_t!r} vs {add_d!r}")
        elif add_t and id_t != id_d:
            diffs.append(f"{kind.upper()} id {id_t!r} vs {id_d!r}")
    nt, nd = len(target.tokens), len(draft.tokens)
    if abs(nt - nd) > VOCAB_MAX_SIZE_DIFFERENCE:
        diffs.append(f"vocab size {nt} vs {nd} (more than {VOCAB_MAX_SIZE_DIFFERENCE} apart)")
    bad = [i for i in range(VOCAB_CHECK_START_TOKEN_ID, min(nt, nd))
           if target.tokens[i] != draft.tokens[i]]
    if bad:
        shown = ", ".join(f"{i}: {target.tokens[i]!r} vs {draft.tokens[i]!r}" for i in bad[:_SHOWN])
        diffs.append(f"{len(bad)} token texts differ (e.g. {shown})")
    return diffs


RETOKENIZE_HINT = "--draft-retokenize (draft_retokenize=True) drafts with it through text"


def check_compatible(target, draft, target_name: str, draft_name: str,
                     retokenize: bool = False) -> None:
    """Raise IncompatibleDraftError naming both files, every difference and the flag that
    drafts through text; retokenize=True (that mode, named): any two vocabularies pass."""
    if retokenize:
        return
    diffs = vocab_differences(target, draft)
    if diffs:
        raise IncompatibleDraftError(
            f"draft {draft_name} cannot be used with target {target_name}: " + "; ".join(diffs)
            + f"; {RETOKENIZE_HINT}")
