"""Where to probe (ALGORITHM.md §2): step-boundary candidates, windowed-entropy scores, greedy allocation
of a per-group pivot budget, and the random-placement ablation.

Shapes: N responses, T token positions (right padded, `mask[i, t]` marks response tokens), M pivot slots.
A pivot at t splits the response before token t: its prefix is the prompt plus response tokens < t.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor
from torch.nn.functional import max_pool1d

__all__ = ["random_pivots", "select_pivots", "step_candidates", "step_end_from_text", "window_max"]

# Raw byte-level BPE token strings (GPT-2, Qwen) spell "\n" as "Ċ"; decoded strings carry "\n" itself.
_NEWLINES = ("\n", "\r", "Ċ")
_SENTENCE_ENDS = (".", "!", "?")
# Closing quotes, brackets and markdown emphasis may follow a sentence end: 'done."', '(see 2.)', '**.'
_TRAILING_CLOSERS = "\"'”’)]}*"


def step_end_from_text(token_texts: Sequence[Sequence[str]], *, separators: Sequence[str] = ()) -> Tensor:
    """Which tokens end a reasoning step, from each token's text.

    A token ends a step if its text contains a newline (also "Ċ", the raw byte-level BPE spelling), or any
    of `separators` (e.g. ";" on the CPU testbed), or ends a sentence: after trailing whitespace, quotes,
    brackets and "*" it ends in ".", "!" or "?". A "." directly followed by a token starting with a digit
    is a decimal point ("3" "." "14"), not a step end.

    Args:
        token_texts: per response, the text of each of its tokens (decoded pieces such as ".\\n" or raw
            token strings such as "Ġ.").
        separators: extra substrings that end a step.

    Returns:
        [N, T] bool with T the longest response, False at padded positions.
    """
    n_positions = max((len(texts) for texts in token_texts), default=0)
    ends = torch.zeros(len(token_texts), n_positions, dtype=torch.bool)
    for row, texts in enumerate(token_texts):
        following = [*texts[1:], ""]  # no token after the last one
        ends[row, : len(texts)] = torch.tensor(
            [_ends_step(text, after, separators) for text, after in zip(texts, following, strict=False)],
            dtype=torch.bool,
        )
    return ends


def _ends_step(text: str, following: str, separators: Sequence[str]) -> bool:
    if any(mark in text for mark in (*_NEWLINES, *separators)):
        return True
    stripped = text.rstrip().rstrip(_TRAILING_CLOSERS)
    if not stripped.endswith(_SENTENCE_ENDS):
        return False
    is_decimal_point = stripped.endswith(".") and following[:1].isdigit()
    return not is_decimal_point


def step_candidates(step_end: Tensor, mask: Tensor, *, margin: int) -> Tensor:
    """Candidate pivot positions: right after a step end, in the interior of the response.

    Position t is a candidate iff token t−1 ends a step and max(margin, 1) ≤ t ≤ T_i − max(margin, 1), i.e.
    at least `margin` tokens from the start and the end, and always a split with a non-empty prefix and
    suffix (1 ≤ t ≤ T_i − 1).

    Args:
        step_end: [N, T] bool, token t ends a step.
        mask: [N, T] bool, response tokens contiguous from position 0 (T_i = mask.sum(1)).
        margin: ≥ 0.

    Returns:
        [N, T] bool.
    """
    if margin < 0:
        raise ValueError(f"margin must be >= 0, got {margin}")
    lengths = mask.sum(dim=1, keepdim=True, dtype=torch.int32)  # int32: ~3× faster than int64 on CPU
    positions = torch.arange(mask.shape[1], device=mask.device)
    after_step_end = torch.cat([torch.zeros_like(step_end[:, :1]), step_end[:, :-1]], dim=1)
    gap = max(margin, 1)
    return after_step_end & (positions >= gap) & (positions <= lengths - gap)


def window_max(entropy: Tensor, mask: Tensor, *, window: int = 8) -> Tensor:
    """Forward-window score: score[i, t] = max of entropy[i, u] over valid u in [t, t + window), at every t.

    Args:
        entropy: [N, T] float, per-token entropy H_{i,t}.
        mask: [N, T] bool, valid tokens.
        window: W ≥ 1.

    Returns:
        [N, T], same dtype; -inf where the window holds no valid token, e.g. past the end of a right-padded
        response (so such positions never win a max).
    """
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    n_rows, n_positions = entropy.shape
    # -inf at invalid positions and over the window − 1 positions past T; filled in place (one pass).
    padded = entropy.new_full((n_rows, n_positions + window - 1), -torch.inf)
    valid_part = padded[:, :n_positions]
    torch.where(mask, entropy, valid_part, out=valid_part)
    return max_pool1d(padded[:, None, :], kernel_size=window, stride=1)[:, 0, :]


def select_pivots(
    score: Tensor, candidates: Tensor, group: Tensor, *, max_pivots: int = 5, min_spacing: int = 16
) -> Tensor:
    """Greedy allocation of at most `max_pivots` pivots per group (ALGORITHM.md §2.4).

    Within each group (responses sharing a group id), repeatedly take the highest-scoring remaining
    candidate over all the group's responses; after taking (i, t), drop response i's candidates closer than
    `min_spacing` to t. Ties go to the lowest response index (row of the batch), then the lowest t.
    All groups are processed at once; the only loop is over the `max_pivots` picks.

    Args:
        score: [N, T] float; a candidate scored -inf is never chosen, a NaN score is an error.
        candidates: [N, T] bool.
        group: [N] long group ids.
        max_pivots: budget per group, ≥ 0.
        min_spacing: ≥ 1; pivots in one response are at least this far apart.

    Returns:
        [N, max_pivots] long: each response's pivots ascending, then -1 padding.
    """
    if max_pivots < 0 or min_spacing < 1:
        raise ValueError(f"need max_pivots >= 0 and min_spacing >= 1, got {max_pivots}, {min_spacing}")
    n_rows, n_positions = score.shape
    device = score.device
    _, group_index = torch.unique(group, return_inverse=True)
    n_groups = int(group_index.max()) + 1 if n_rows else 0
    rows = torch.arange(n_rows, device=device)

    # Work on each row's candidate list, [N, C] with C the most candidates in a row (step boundaries are
    # sparse, so C ≪ T), in ascending t; unused slots have position T and score -inf.
    cand_row, cand_pos = candidates.nonzero(as_tuple=True)  # row-major: t ascends within a row
    per_row = torch.bincount(cand_row, minlength=n_rows)
    width = max(int(per_row.max()) if cand_row.numel() else 0, 1)  # ≥ 1 slot: every max reduces something
    slot = torch.arange(cand_row.numel(), device=device) - (per_row.cumsum(0) - per_row)[cand_row]
    position = torch.full((n_rows, width), n_positions, dtype=torch.long, device=device)
    position[cand_row, slot] = cand_pos
    remaining = torch.full((n_rows, width), -torch.inf, dtype=score.dtype, device=device)
    remaining[cand_row, slot] = score[cand_row, cand_pos]

    # Best remaining candidate of each row: max returns the first (lowest t) of tied maxima.
    best_score, best_slot = remaining.max(dim=1)
    if best_score.isnan().any():  # max propagates NaN, so checking each row's max covers every candidate
        raise ValueError(f"score is NaN at a candidate of row {int(best_score.isnan().nonzero()[0])}")
    picks = torch.full((n_rows, max_pivots), n_positions, dtype=torch.long, device=device)
    n_picked = torch.zeros(n_rows, dtype=torch.long, device=device)
    for _ in range(max_pivots):
        group_best = best_score.new_full((n_groups,), -torch.inf).scatter_reduce(
            0, group_index, best_score, "amax"
        )
        winner = (best_score > -torch.inf) & (best_score == group_best[group_index])
        chosen = rows.new_full((n_groups,), n_rows).scatter_reduce(
            0, group_index, torch.where(winner, rows, n_rows), "amin"
        )
        chosen = chosen[chosen < n_rows]  # groups with candidates left; one row each, so rows are distinct
        taken = position[chosen, best_slot[chosen]]
        picks[chosen, n_picked[chosen]] = taken
        n_picked[chosen] += 1
        # Only the chosen rows change: drop their candidates near the pick and refresh their best.
        too_close = (position[chosen] - taken[:, None]).abs() < min_spacing
        remaining[chosen] = remaining[chosen].masked_fill(too_close, -torch.inf)
        best_score[chosen], best_slot[chosen] = remaining[chosen].max(dim=1)

    picks = picks.sort(dim=1).values  # unused slots hold T, so they sort last
    return torch.where(picks < n_positions, picks, -1)


def random_pivots(mask: Tensor, group: Tensor, *, max_pivots: int, generator: torch.Generator) -> Tensor:
    """The `selector: random` ablation: per group, `max_pivots` distinct (response, t) drawn uniformly from
    all interior positions 1..T_i−1 of the group's responses; no step-boundary, margin or spacing rules.

    Implemented as the greedy selector on i.i.d. uniform keys: the top keys of a set form a uniform random
    subset of it. Deterministic given the generator's state (which it advances).

    Args:
        mask: [N, T] bool, response tokens contiguous from position 0.
        group: [N] long group ids.
        max_pivots: budget per group; a group with fewer interior positions gets all of them.
        generator: on the device of `mask`.

    Returns:
        [N, max_pivots] long, ascending per row, -1 padded.
    """
    interior = mask & (torch.arange(mask.shape[1], device=mask.device) >= 1)
    # float64 keys: ties (broken by index, not at random) are practically impossible.
    keys = torch.rand(mask.shape, generator=generator, dtype=torch.float64, device=mask.device)
    return select_pivots(keys, interior, group, max_pivots=max_pivots, min_spacing=1)
