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

Written once, as a coroutine over target passes (`speculative_steps` yields interfaces.Eval
and is sent the logits); `generate_speculative` drives it alone, the server batches it with
other requests.  The step stops early when `on_token` returns True (a stop string).

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
from dataclasses import dataclass, replace
from typing import Callable, Collection, Sequence

import numpy as np

from .drafters import Draft, Drafter
from .drafters.base import DraftTree
from .drafters.forced import ForcedDrafter
from .constrained import draft_under, settle, settle_path, tree_under
from ..generation.constraint import Constraint, masked
from .drafters.prediction import SOURCE as PREDICTED
from ..errors import ConfigError, IncompatibleDraftError
from ..generation.plain import check_request, kept_prefix
from ..generation.interfaces import (DrafterStats, Eval, EvalTree, GenerationResult, OnToken, Session, SpecStats,
                          Steps, drive, make_timings)
from .policies import DRAFT_N_MAX, DraftPolicy, FixedLength, StepFeedback, check_draft_n
from ..generation.sampling import Rng, SamplerParams, probs_rows
from .trace import TraceSink, step_record
from .tree_verify import verify_tree
from .verify import VerifyResult, verify

TREE_K_MAX = 8          # most branches of --draft-tree

__all__ = ["DRAFT_N_MAX", "TREE_K_MAX", "check_tree_k", "DrafterStats", "SpecStats", "check_draft_n",
           "generate_speculative", "spec_stats", "speculative_steps"]


def speculative_steps(target: Session, drafter: Drafter, prompt_ids: Sequence[int],
                      n_predict: int, params: SamplerParams, rng: Rng,
                      eog_ids: Collection[int], policy: DraftPolicy,
                      on_token: OnToken | None = None, trace: TraceSink | None = None,
                      clock: Callable[[], float] = time.perf_counter, *,
                      n_keep: int = 0, tree_k: int = 1, constraint: Constraint | None = None) -> Steps:
    """The coroutine behind `generate_speculative`: yields one Eval per target pass (the
    prompt, then one verification pass per step; an EvalTree per step when tree_k > 1).
    constraint: the output must fit it (a fresh generation.constraint.Constraint; the law
    is plain constrained sampling's, see constrained.py); its forced tokens are drafted
    first (drafters.ForcedDrafter around `drafter`)."""
    check_draft_n(policy.n_max)
    check_tree_k(tree_k)
    check_request(target, prompt_ids, n_predict)
    if drafter.n_vocab != target.n_vocab:
        raise IncompatibleDraftError(
            f"the drafter proposes over {drafter.n_vocab} token ids, the target has {target.n_vocab}")
    keep = kept_prefix(target, prompt_ids, n_keep)
    target.truncate(keep)
    if constraint is not None and not isinstance(drafter, ForcedDrafter):
        drafter = ForcedDrafter(drafter)
    drafter.constrain(constraint)
    ends = frozenset(eog_ids) | (constraint.eos_ids if constraint is not None else frozenset())
    if n_keep == 0:
        drafter.reset()
    policy.reset()
    ctx, ids, steps, stop, why = list(prompt_ids), [], [], "n_predict", []
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
        timer = _StepTimer(clock)
        key = drafter.key(ctx)
        policy.prepare(key)                               # what kind of draft comes next
        asked = policy.next_n()
        why[1:] = [getattr(policy, "reason", "")]        # the plan's reasons: first step's, last step's
        if int(asked) != asked or not 0 <= asked <= policy.n_max:
            raise ValueError(f"draft policy asked for {asked} tokens, outside 0..{policy.n_max}")
        n_max = min(asked, n_predict - len(ids) - 1, room)
        if tree_k > 1:                                    # k branches, at most room rows in all
            res, drafted, q_rows, p_rows, branch, n_drafted, source = yield from _tree_step(
                target, drafter, ctx, min(n_max, room // tree_k), tree_k, params, rng, timer, constraint)
        else:
            # 1. draft: x_1..x_n ~ q, with q_i the law each x_i was drawn from
            draft = drafter.propose(ctx, n_max, rng) if n_max > 0 else Draft.empty(target.n_vocab)
            if len(draft.tokens) > n_max:
                raise ValueError(f"drafter proposed {len(draft.tokens)} tokens, at most {n_max} were asked for")
            if constraint is not None:                      # cut where forbidden; each row's mask
                draft, masks, pushed = draft_under(draft, constraint)
            n = len(draft.tokens)
            timer.lap("draft")
            # 2. one target pass over [last token, x_1..x_n]: p_1..p_{n+1} (masked: the law of
            #    plain constrained sampling at every row)
            logits = yield Eval(target, [ctx[-1], *draft.tokens])   # (n+1, V)
            p = probs_rows(logits if constraint is None else masked(logits, masks), params)   # (n+1, V)
            # 3. accept x_i with prob min(1, p_i/q_i); the first rejection resamples from
            #    norm(max(0, p_i - q_i)), all accepted draws a bonus from p_{n+1}
            res = verify(draft.tokens, draft.q, p, rng)
            # 4. roll the caches back to the accepted context
            target.truncate(target.n_past - (n - res.n_accepted))
            if constraint is not None:
                settle(constraint, draft.tokens, pushed, res.n_accepted, res.next_token)
            timer.lap("verify")
            drafted, q_rows, p_rows, branch, n_drafted, source = draft.tokens, draft.q, p, (0, 1), n, draft.source
        woken = tuple(getattr(target, "last_experts", ()))  # MoE: the verify pass's experts
        drafter.accept(res.n_accepted, res.next_token)
        timer.lap("draft")
        emitted: list[int] = []
        kinds = ["predicted" if source == PREDICTED else "accepted"] * res.n_accepted + [res.kind]
        for token, kind in zip([*drafted[: res.n_accepted], res.next_token], kinds):
            if token in ends:
                stop = "eog"
                break
            emitted.append(token)
            if on_token is not None and on_token(token, kind):
                stop = "stop"
                break
        steps.append(_Step(n_drafted=n_drafted, result=res, draft_s=timer.spent["draft"],
                           verify_s=timer.spent["verify"], source=source, n_max=n_max,
                           asked=asked))
        policy.observe(StepFeedback(source, n_max, n_drafted, len(res.records), res.n_accepted,
                                    steps[-1].draft_s, steps[-1].verify_s, key,
                                    float(np.mean(woken)) if woken else None, _routing(target)))
        if trace is not None:
            trace.write(step_record(len(steps) - 1, len(ctx), drafted, q_rows, p_rows, res,
                                    emitted, stop == "eog", steps[-1].draft_s, steps[-1].verify_s,
                                    branch=branch[0], n_branches=branch[1], n_nodes=n_drafted,
                                    source=source, experts=woken, plan=getattr(policy, "reason", "")))
        ids += emitted
        ctx += emitted
        if constraint is not None and constraint.done and stop == "n_predict":
            stop = "eog"                                  # the grammar allows nothing but its end
    t2 = clock()
    timings = make_timings(t1 - t0, t2 - t1, len(ids))
    stats = spec_stats(steps, policy.n_max, len(ids), timings.tokens_per_s)
    stats = replace(stats, plan=" ... last step: ".join(dict.fromkeys(w for w in why if w)))
    return GenerationResult(ids, len(prompt_ids), timings, stop, stats)


def _routing(target: Session) -> tuple[int, int] | None:
    """(E, k) of an MoE target session, None for a dense one."""
    cfg = getattr(target, "cfg", None)
    return (cfg.n_expert, cfg.n_expert_used) if getattr(cfg, "is_moe", False) else None


def check_tree_k(k: int) -> None:
    if int(k) != k or not 1 <= k <= TREE_K_MAX:
        raise ConfigError(f"--draft-tree must be an integer in 1..{TREE_K_MAX}, got {k}")


def _tree_step(target: Session, drafter: Drafter, ctx: list[int], n_max: int, k: int,
               params: SamplerParams, rng: Rng, timer: "_StepTimer", constraint: Constraint | None = None):
    """One multi-candidate step (tree_verify.py): draft up to k branches of at most n_max
    tokens, one target pass over the tree rooted at the last token, walk it, keep the accepted
    path in the target cache.  Returns (the verified branch's linear VerifyResult, its tokens,
    q rows, p rows (n+1, V), (branch, n_branches), tree nodes, source)."""
    tree = drafter.propose_tree(ctx, n_max, k, rng) if n_max > 0 else DraftTree.of(Draft.empty(target.n_vocab))
    depth = max((len(tree.path(i)) for i in range(len(tree.tokens))), default=0)
    if depth > n_max or len(tree.leaves()) > k:
        raise ValueError(f"drafter proposed a tree of depth {depth} with {len(tree.leaves())} "
                         f"branches, at most {n_max} and {k} were asked for")
    if constraint is not None:                                    # prune forbidden one-hot nodes; row masks
        tree, masks = tree_under(tree, constraint)
    timer.lap("draft")
    logits = yield EvalTree(target, [ctx[-1], *tree.tokens], [-1, *(a + 1 for a in tree.parents)])
    p = probs_rows(logits if constraint is None else masked(logits, masks), params)   # (n+1, V) row 0: after ctx
    res = verify_tree(tree, p, rng)
    target.commit_path([0, *(c + 1 for c in res.path)])          # ctx + the accepted path
    if constraint is not None:
        settle_path(constraint, [tree.tokens[c] for c in res.path], res.next_token)
    timer.lap("verify")
    nodes = tree.path(tree.leaves()[res.branch]) if tree.tokens else []
    return (res.linear, tuple(tree.tokens[c] for c in nodes), tree.q[nodes],
            p[[0, *(c + 1 for c in nodes)]], (res.branch, res.n_branches), len(tree.tokens), tree.source)


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


class _StepTimer:
    """Seconds per phase of one step: lap(phase) charges the time since the last lap."""

    def __init__(self, clock: Callable[[], float]):
        self.clock, self.t = clock, clock()
        self.spent = {"draft": 0.0, "verify": 0.0}

    def lap(self, phase: str) -> None:
        t = self.clock()
        self.spent[phase] += t - self.t
        self.t = t


@dataclass(frozen=True)
class _Step:
    n_drafted: int
    result: VerifyResult
    draft_s: float
    verify_s: float
    source: str = "none"                # Draft.source
    n_max: int = 0                      # tokens the drafter was allowed (after caps)
    asked: int = 0                      # tokens the policy asked for


def spec_stats(steps: Sequence[_Step], draft_n: int, n_generated: int,
               tokens_per_s: float) -> SpecStats:
    """Aggregate per-step verification results (pure)."""
    reached = np.zeros(draft_n, dtype=np.int64)           # (draft_n,) positions verified
    accepted = np.zeros(draft_n, dtype=np.int64)          # (draft_n,) positions accepted
    alpha_sum = 0.0
    for s in steps:
        for j, r in enumerate(s.result.records):
            reached[j] += 1
            accepted[j] += r.accepted
            alpha_sum += s.result.alpha[j]
    n_drafted = sum(s.n_drafted for s in steps)
    n_accepted = int(accepted.sum())
    n_verified = int(reached.sum())
    by_drafter = {src: _drafter_stats([s for s in steps if s.source == src and s.n_max > 0])
                  for src in dict.fromkeys(s.source for s in steps if s.n_max > 0)}
    return SpecStats(
        n_generated=n_generated, n_steps=len(steps), n_drafted=n_drafted, n_accepted=n_accepted,
        acceptance_rate=_ratio(n_accepted, n_drafted),
        tokens_per_step=_ratio(n_generated, len(steps)),
        acceptance_by_position=tuple(float(a / r) if r else None for a, r in zip(accepted, reached)),
        n_verified=n_verified,
        predicted_acceptance=_ratio(alpha_sum, n_verified),
        measured_acceptance=_ratio(n_accepted, n_verified),
        draft_s=sum(s.draft_s for s in steps), verify_s=sum(s.verify_s for s in steps),
        tokens_per_s=tokens_per_s, by_drafter=by_drafter,
        mean_draft_n=_ratio(sum(s.asked for s in steps), len(steps)))


def _drafter_stats(steps: Sequence[_Step]) -> DrafterStats:
    n_drafted = sum(s.n_drafted for s in steps)
    n_verified = sum(len(s.result.records) for s in steps)
    n_accepted = sum(s.result.n_accepted for s in steps)
    alpha_sum = sum(sum(s.result.alpha[: len(s.result.records)]) for s in steps)
    return DrafterStats(len(steps), n_drafted, n_verified, n_accepted,
                        acceptance_rate=_ratio(n_accepted, n_drafted),
                        predicted_acceptance=_ratio(alpha_sum, n_verified),
                        measured_acceptance=_ratio(n_accepted, n_verified),
                        draft_s=sum(s.draft_s for s in steps))


def _ratio(a: float, b: float) -> float:
    return float(a / b) if b else 0.0
