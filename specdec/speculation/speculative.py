"""Speculative decoding: a drafter proposes, the target verifies all proposals in one pass.

Leviathan, Kalman, Matias 2023, "Fast Inference from Transformers via Speculative Decoding",
Algorithm 1; Chen et al. 2023.  p is always the target's distribution, q the draft's.  The
output has exactly the law of sampling the target alone with the same SamplerParams (and,
at temperature 0, exactly its greedy output), whatever the drafter proposes.

Cache invariant: between steps the target cache holds the accepted context minus its last
token; each step feeds that token followed by the n drafted ones, so one eval of n + 1 rows
gives p for every drafted position plus one beyond (the bonus).  The prompt is prefilled
without its last token for the same reason.  With tree_k > 1 the step feeds that token as the
root of a token tree of candidates (target.eval_tree) and keeps the accepted path
(target.commit_path): the same invariant.

Read `linear_step` first: one step, draft -> one target pass -> accept/resample -> roll back,
with the law in its comments.  `speculative_steps` is the loop around it (or around
tree_verify.tree_step, the same step over a tree of candidates): the budget, the drafter's
accept, the emitted tokens; what each step leaves behind (statistics, the policy's feedback,
the trace) is bookkeeping.py's, a grammar's part of a step constrained.py's.

Written once, as a coroutine over target passes (`speculative_steps` yields interfaces.Eval
and is sent the logits); `generate_speculative` drives it alone, the server batches it with
other requests.  The loop stops early when `on_token` returns True (a stop string).

Per step at most n_predict - generated tokens are emitted (the draft is capped at one less),
and nothing after an end-of-generation token.  Timings: prompt_s covers the prefill of all
prompt tokens but the last, the target's and the drafter's (`drafter.prefill`);
decode_s everything after it (drafting included).

How many tokens to draft is the policy's choice (specdec.speculation.policies): told the drafter's key
for the step (`drafter.key(ctx)`, `policy.prepare(key)`; None when the drafter has none),
asked before each step, told the outcome and the measured draft / verify times after it.  The clock is injected
(`clock=`) so that tests can make timing-driven policies deterministic.
"""
from __future__ import annotations

import time
from typing import Callable, Collection, Generator, Sequence

import numpy as np

from ..errors import ConfigError, IncompatibleDraftError
from ..generation.constraint import Constraint
from ..generation.interfaces import Eval, GenerationResult, OnToken, Session, Steps, drive, make_timings
from ..generation.plain import check_request, kept_prefix
from ..generation.sampling import Rng, SamplerParams, probs_rows
from .bookkeeping import Bookkeeper, StepResult, StepTimer
from .constrained import Unconstrained, step_constraint
from .drafters import Draft, Drafter
from .policies import DRAFT_N_MAX, DraftPolicy, FixedLength, check_draft_n
from .trace import TraceSink
from .tree_verify import tree_step
from .verify import verify

TREE_K_MAX = 8          # most branches of --draft-tree

__all__ = ["DRAFT_N_MAX", "TREE_K_MAX", "check_tree_k", "check_draft_n", "generate_speculative",
           "linear_step", "speculative_steps"]


def linear_step(target: Session, drafter: Drafter, ctx: Sequence[int], n_max: int,
                params: SamplerParams, rng: Rng, timer: StepTimer,
                guard: Unconstrained) -> Generator[Eval, np.ndarray, StepResult]:
    """One step of Leviathan et al. 2023, Algorithm 1: draft, one target pass, accept or
    resample, roll back.  On entry the target cache holds ctx but its last token."""
    # 1. draft x_1..x_n ~ q (n <= n_max), q_i the law x_i was drawn from (one-hot for a copy,
    #    e.g. prompt lookup: x_i is then a function of the context)
    draft = drafter.propose(ctx, n_max, rng) if n_max > 0 else Draft.empty(target.n_vocab)
    if len(draft.tokens) > n_max:
        raise ValueError(f"drafter proposed {len(draft.tokens)} tokens, at most {n_max} were asked for")
    draft = guard.cut(draft)                      # a grammar: cut where a one-hot draft is forbidden
    n = len(draft.tokens)
    timer.lap("draft")
    # 2. one target pass over [last token, x_1..x_n]: p_1..p_{n+1}, p_i the target's law at
    #    position i (under a grammar: its masked, renormalised law, as plain sampling's)
    logits = yield Eval(target, [ctx[-1], *draft.tokens])        # (n+1, V)
    p = probs_rows(guard.masked(logits), params)                  # (n+1, V)
    # 3. exact rejection sampling: accept x_i with probability min(1, p_i(x_i) / q_i(x_i));
    #    the first rejection resamples from norm(max(0, p_i - q_i)) and ends the step; when
    #    all n are accepted, a bonus token is drawn from p_{n+1}.  Each emitted token has
    #    law p, whatever q is (verify.py).
    res = verify(draft.tokens, draft.q, p, rng)
    # 4. roll back: the target cache keeps ctx[-1] and the accepted x's (the drafter rolls
    #    its own back in drafter.accept); the grammar keeps them and the sampled token
    target.truncate(target.n_past - (n - res.n_accepted))
    guard.settle(res.n_accepted, res.next_token)
    timer.lap("verify")
    return StepResult(res, draft.tokens, draft.q, p, draft.source, n, target.routing(),
                      catchup_s=draft.catchup_s)


def speculative_steps(target: Session, drafter: Drafter, prompt_ids: Sequence[int],
                      n_predict: int, params: SamplerParams, rng: Rng,
                      eog_ids: Collection[int], policy: DraftPolicy,
                      on_token: OnToken | None = None, trace: TraceSink | None = None,
                      clock: Callable[[], float] = time.perf_counter, *,
                      n_keep: int = 0, tree_k: int = 1, constraint: Constraint | None = None) -> Steps:
    """The coroutine behind `generate_speculative`: yields one Eval per target pass (the
    prompt, then one verification pass per step; an EvalTree per step when tree_k > 1).
    constraint: the output must fit it (a fresh generation.constraint.Constraint; the law
    is plain constrained sampling's, see constrained.py); a drafter wrapped in
    drafters.ForcedDrafter (as the drafting plan wraps it) drafts its forced tokens first."""
    keep = _check(target, drafter, prompt_ids, n_predict, policy, tree_k, n_keep)
    guard = step_constraint(constraint)
    drafter.constrain(guard.constraint)
    drafter.attach(target)                                # before the prompt pass (MTPDrafter reads it)
    ends = frozenset(eog_ids) | guard.eos_ids
    if n_keep == 0:
        drafter.reset()
    policy.reset()
    book, ctx, ids, stop = Bookkeeper(policy, trace), list(prompt_ids), [], "n_predict"
    t0 = clock()
    if len(ctx) - 1 > keep and n_predict > 0:
        yield Eval(target, ctx[keep:-1], True)            # the last prompt id opens step 0
    drafter.prefill(ctx)                                  # the drafter's prompt phase
    t1 = clock()
    while len(ids) < n_predict and stop == "n_predict":
        room = target.n_ctx - target.n_past - 1           # rows the eval may add after ctx[-1]
        if room < 0:
            stop = "ctx_full"
            break
        timer = StepTimer(clock)
        n_max = book.ask(drafter.key(ctx), min(n_predict - len(ids) - 1, room))
        if tree_k > 1:                                    # k branches, at most room rows in all
            step = yield from tree_step(target, drafter, ctx, min(n_max, room // tree_k), tree_k,
                                        params, rng, timer, guard)
        else:
            step = yield from linear_step(target, drafter, ctx, n_max, params, rng, timer, guard)
        drafter.accept(step.result.n_accepted, step.result.next_token)
        timer.lap("draft")
        emitted, stop = _emit(step, ends, on_token)
        book.record(step, len(ctx), emitted, stop == "eog", timer)
        ids += emitted
        ctx += emitted
        if guard.done and stop == "n_predict":
            stop = "eog"                                  # the grammar allows nothing but its end
    timings = make_timings(t1 - t0, clock() - t1, len(ids))
    return GenerationResult(ids, len(prompt_ids), timings, stop, book.stats(len(ids), timings))


def _emit(step: StepResult, ends: frozenset[int], on_token: OnToken | None) -> tuple[list[int], str]:
    """The step's tokens up to an end-of-generation one ('eog', not emitted) or on_token's
    True ('stop'); else all of them ('n_predict': go on)."""
    emitted: list[int] = []
    for token, kind in step.tokens():
        if token in ends:
            return emitted, "eog"
        emitted.append(token)
        if on_token is not None and on_token(token, kind):
            return emitted, "stop"
    return emitted, "n_predict"


def _check(target: Session, drafter: Drafter, prompt_ids: Sequence[int], n_predict: int,
           policy: DraftPolicy, tree_k: int, n_keep: int) -> int:
    """Check a request's arguments; truncate the target to the rows it keeps (returned)."""
    check_draft_n(policy.n_max)
    check_tree_k(tree_k)
    check_request(target, prompt_ids, n_predict)
    if drafter.n_vocab != target.n_vocab:
        raise IncompatibleDraftError(
            f"the drafter proposes over {drafter.n_vocab} token ids, the target has {target.n_vocab}")
    keep = kept_prefix(target, prompt_ids, n_keep)
    target.truncate(keep)
    return keep


def check_tree_k(k: int) -> None:
    if int(k) != k or not 1 <= k <= TREE_K_MAX:
        raise ConfigError(f"--draft-tree must be an integer in 1..{TREE_K_MAX}, got {k}")


def generate_speculative(target: Session, drafter: Drafter, prompt_ids: Sequence[int],
                         n_predict: int, params: SamplerParams, rng: Rng,
                         eog_ids: Collection[int], draft_n: int = 5,
                         on_token: OnToken | None = None,
                         trace: TraceSink | None = None,
                         policy: DraftPolicy | None = None,
                         clock: Callable[[], float] = time.perf_counter, *,
                         n_keep: int = 0, tree_k: int = 1,
                         constraint: Constraint | None = None) -> GenerationResult:
    """Sample up to n_predict tokens from the target, drafting up to policy.next_n() per step
    (policy None: FixedLength(draft_n); draft_n is ignored otherwise).

    Each step is Leviathan et al. 2023, Algorithm 1: draft n tokens, one target pass over
    [last token] + draft, accept/resample with `verify`, roll the caches back.

    n_keep > 0 resumes a conversation: the target's first n_keep rows are prompt_ids[:n_keep]
    (plain.kept_prefix) and the drafter is not reset: it reconciles its own cache with the
    context it is given.  Only the new prompt tokens are evaluated; the output is unchanged.

    tree_k > 1 verifies up to tree_k candidate continuations per step in one target pass
    (drafter.propose_tree, tree_verify.verify_tree; the target session needs eval_tree and
    commit_path), each at most min(draft length, room / tree_k) deep; same output law."""
    if policy is None:
        check_draft_n(draft_n)
        policy = FixedLength(draft_n)
    return drive(speculative_steps(target, drafter, prompt_ids, n_predict, params, rng, eog_ids,
                                   policy, on_token, trace, clock, n_keep=n_keep, tree_k=tree_k,
                                   constraint=constraint))
