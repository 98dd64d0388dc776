"""``compare``: done trials' tokens/s ratios on their shared prompts, intervals and verdicts."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rich.console import Console

from orchestrator.analysis import report
from orchestrator.analysis.stats import MIN_PROMPTS
from orchestrator.cli.common import (
    EXIT_OK,
    PROG,
    UserError,
    add_command,
    opened_store,
)

if TYPE_CHECKING:
    from orchestrator.analysis.metrics import ModelError


def add_parser(commands: Any, db: list[Any]) -> None:
    """Add ``compare``."""
    command = add_command(
        commands,
        "compare",
        handle,
        "compare done trials on their shared prompts: tokens/s ratio, interval, verdict",
        "The ratio is A's tokens/s over B's on the shared prompts; its 95% interval is a t\n"
        "interval on the log ratio with the jackknife standard error over those prompts,\n"
        "leaving a prompt out of both trials at once (paired). Verdict: faster (interval above\n"
        "1), slower (below 1), or not distinguishable. Fewer than "
        f"{MIN_PROMPTS} shared prompts: no\n"
        "interval. Several pairs (A B A2 B2 ...) are one family: Holm-adjusted verdicts and\n"
        "intervals at 1 - 0.05/m, which hold together. Where both trials of every pair stored\n"
        "their decode seconds, the decode-only ratio (prefill left out) comes first, as its own\n"
        "family, then the end-to-end one. A replayed side's seconds are projected by its cost\n"
        "fit: the interval and p then include the fit's measured out-of-sample error (against\n"
        "a live side its e; two sides of one fit the error of a ratio of two projections,\n"
        "measured on its live checks; two fits both), and the output says so.\n\n"
        "examples:\n"
        f"  {PROG} compare 3f2a9c01d4e5b6a7 9e8d7c6b5a4f3e2d\n"
        f"  {PROG} compare A1 B A2 B A3 B  # three trials against B, Holm-adjusted\n"
        f'  {PROG} query "SELECT trial_id, policy, speedup FROM trials"  # find trial ids',
        db,
    )
    command.add_argument(
        "trials",
        nargs="+",
        metavar="TRIAL_A TRIAL_B",
        help="trial ids in pairs: each A (the numerator) then its B (the denominator)",
    )


def handle(args: argparse.Namespace, console: Console) -> int:
    """``compare``: A's tokens/s over B's on their shared prompts, with interval and verdict,
    decode-only first where stored, then end to end; several pairs are one Holm-adjusted
    family per measure."""
    from orchestrator.analysis.metrics import paired_model_error
    from orchestrator.analysis.pairing import decode_speeds

    if len(args.trials) % 2:
        raise UserError(
            f"error: compare takes trial ids in pairs (A B [A2 B2 ...]); got {len(args.trials)}"
        )
    with opened_store(args.db, read_only=True) as store:
        rows = {row.trial_id: row for row in store.trial_rows(args.trials)}
        for trial_id in args.trials:
            if trial_id not in rows:
                raise UserError(f"error: no trial {trial_id!r} in the store")
            if rows[trial_id].status != "done":
                raise UserError(f"error: trial {trial_id} is {rows[trial_id].status}, not done")
        samples = {trial_id: store.sample_speeds(trial_id) for trial_id in set(args.trials)}
        fits = store.side_fits(rows.values())
    pairs = list(zip(args.trials[::2], args.trials[1::2], strict=True))
    errors = [paired_model_error(fits.get(a), fits.get(b)) for a, b in pairs]
    sampled = [(samples[a], samples[b]) for a, b in pairs]
    decoded = [(decode_speeds(a), decode_speeds(b)) for a, b in sampled]
    measures = [("end-to-end", sampled)]
    if all(a is not None and b is not None for a, b in decoded):
        measures.insert(0, ("decode-only", decoded))
    lines: list[str] = []
    for measure, measured in measures:
        lines += _measure_lines(rows, pairs, measured, measure, errors)
    for line in lines:
        console.print(line, markup=False)
    return EXIT_OK


def _measure_lines(
    rows: dict[str, Any],
    pairs: list[tuple[str, str]],
    sampled: list[Any],
    measure: str,
    errors: Sequence[ModelError | None],
) -> list[str]:
    """Return the comparison lines of ``pairs`` by one measure's samples (one Holm family),
    each widened by the cost-model error it carries (``errors``, one per pair)."""
    from orchestrator.analysis.pairing import compare_family, paired_ratio

    if len(pairs) > 1:
        family = compare_family(sampled, errors)
    else:
        family = [paired_ratio(*sampled[0], model_error=errors[0])]
    if len(pairs) == 1 and family[0].ratio is None:
        a, b = pairs[0]
        raise UserError(report.comparison_refusal(rows[a], rows[b], family[0].n_prompts))
    lines = report.family_header(family, measure) if len(pairs) > 1 else []
    for (a, b), compared, (got_a, got_b) in zip(pairs, family, sampled, strict=True):
        prompts_a, prompts_b = ({s.prompt_id for s in got} for got in (got_a, got_b))
        lines += report.comparison_lines(
            rows[a], rows[b], compared, len(prompts_a), len(prompts_b), measure
        )
    return lines
