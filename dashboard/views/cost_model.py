"""Cost model: T = t_draft·N_draft + t_target·N_target fitted over rounds, measured vs predicted."""

from __future__ import annotations

import streamlit as st

from dashboard import charts, data

context: data.DashboardContext = st.session_state[data.CONTEXT_KEY]
trials = context.trials
cache = st.cache_data(ttl=data.CACHE_TTL_S, show_spinner=False)
cached_round_timings = cache(data.load_round_timings)
GROUP_CHOICES = ["pair", "dataset", "temperature", "policy", "max_draft_len"]

st.header("Cost model")
st.caption(
    "Least squares over rounds: a round costs t_draft per draft forward plus t_target for its "
    "verify call; T is its draft plus verify seconds. R² is 1 − SS_res/SS_tot over rounds; the "
    "chart compares each trial's measured time (sum over its rounds) with the fit. Replayed "
    "trials (mode replay) are left out: their round times are projections of a fit."
)
group_by = st.multiselect(
    "Fit one model per", GROUP_CHOICES, default=["pair"], help="Empty: one fit for everything."
)
include_baseline = st.checkbox(
    "Include the AR baseline's rounds",
    help="Off: fit speculative rounds only (the baseline's one-token steps take another path).",
)
try:
    timings = cached_round_timings(context.url, tuple(trials["trial_id"]))
except data.StoreUnavailable as error:
    st.warning(f"Cannot read the rounds: {error}")
    st.stop()
if timings.empty:
    st.info("No rounds stored for these trials (the sweep ran with record_rounds: false).")
    st.stop()

fits, totals = data.cost_model_fits(timings, trials, group_by, include_baseline)
fitted = fits[fits["problem"] == ""]
if len(fitted) == 1:
    fit = fitted.iloc[0]
    columns = st.columns(4)
    columns[0].metric("t_draft", f"{fit['t_draft'] * 1e3:.3f} ms")
    columns[1].metric("t_target", f"{fit['t_target'] * 1e3:.3f} ms")
    columns[2].metric("R²", f"{fit['r2']:.3f}")
    columns[3].metric("mean |error| per trial", f"{fit['mean_abs_error']:.1%}")
st.dataframe(fits.round(6), hide_index=True)
if not totals.empty:
    st.plotly_chart(charts.cost_scatter_figure(totals), key="cost")
