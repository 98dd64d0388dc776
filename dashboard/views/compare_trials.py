"""Compare two trials on their shared prompts: tokens/s ratio, paired 95% interval, verdict."""

from __future__ import annotations

import streamlit as st

from dashboard import data, trial_compare
from orchestrator.analysis.report import model_error_note
from orchestrator.analysis.stats import too_few_prompts

context: data.DashboardContext = st.session_state[data.CONTEXT_KEY]
labels = trial_compare.trial_choices(context.trials)

st.header("Compare two trials")
st.caption(
    "A's tokens/s over B's on the prompts both measured, decode-only (prefill left out) first "
    "where both trials stored it, then end-to-end; the interval is a t interval on the log "
    "ratio with the jackknife standard error over those prompts, each left out of both trials "
    "at once (paired), as in `python -m orchestrator compare A B`; with a replayed side it "
    "includes the cost model's measured error."
)
if len(labels) < 2:
    st.info("Fewer than two finished trials in this selection.")
    st.stop()
ids = list(labels)
left, right = st.columns(2)
trial_a = left.selectbox("Trial A", ids, index=1, format_func=labels.get)
trial_b = right.selectbox("Trial B", ids, index=0, format_func=labels.get)
try:
    by_measure = trial_compare.compare_trials(context.url, trial_a, trial_b)
except data.StoreUnavailable as error:
    st.warning(f"Cannot read the samples: {error}")
    st.stop()
compared = by_measure["end-to-end"]
if compared.ratio is None:
    st.error(
        f"These trials share {compared.n_prompts} prompt(s), so no interval is shown: "
        f"{too_few_prompts(compared.n_prompts)} measured by both (pick trials of the same "
        "dataset slice)."
    )
    st.stop()
for measure, compared in by_measure.items():
    if compared.ratio is None:
        continue
    columns = st.columns(3)
    columns[0].metric(f"{measure} tokens/s A / B", f"{compared.ratio.estimate:.3f}")
    columns[1].metric(
        f"{measure}: 95% interval", f"[{compared.ratio.low:.3f}, {compared.ratio.high:.3f}]"
    )
    columns[2].metric(
        f"{measure}: verdict",
        f"A is {compared.verdict}"
        if compared.verdict != "not distinguishable"
        else "not distinguishable",
    )
st.caption(f"Over {compared.n_prompts} shared prompts (n = {compared.ratio.n}).")
for note in model_error_note(compared.model_error):
    st.caption(note.removeprefix("note: "))
