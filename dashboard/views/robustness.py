"""Robustness: speedup vs temperature, tokens/s vs threshold, drafted/accepted lengths per round."""

from __future__ import annotations

import streamlit as st

from dashboard import charts, data

context: data.DashboardContext = st.session_state[data.CONTEXT_KEY]
trials = context.trials
cache = st.cache_data(ttl=data.CACHE_TTL_S, show_spinner=False)
cached_round_counts = cache(data.load_round_counts)

st.header("Robustness")

st.subheader("Speedup vs temperature")
st.caption(
    "Each policy's best setting at each temperature (mean end-to-end speedup over the selected "
    "trials), chosen and measured on the same prompts; the Tables page chooses on dev prompts "
    "and measures on test prompts, decode-only where stored."
)
by_temperature = data.speedup_vs_temperature(trials)
if by_temperature.empty:
    st.info("No speedups yet: the AR baselines of these trials have not finished.")
else:
    st.plotly_chart(charts.speedup_temperature_figure(by_temperature), key="temperature")

st.subheader("Tokens/s vs threshold")
by_threshold = data.throughput_vs_threshold(trials)
if by_threshold.empty:
    st.info("No threshold policy (max_confidence, adaedl, svip, specdecpp) in this selection.")
else:
    st.plotly_chart(charts.threshold_figure(by_threshold), key="threshold")

st.subheader("Drafted and accepted tokens per round")
try:
    counts = cached_round_counts(context.url, tuple(trials["trial_id"]))
except data.StoreUnavailable as error:
    st.warning(f"Cannot read the rounds: {error}")
else:
    distribution = data.round_length_distribution(counts, trials)
    if distribution.empty:
        st.info("No rounds stored for these trials (the sweep ran with record_rounds: false).")
    else:
        st.plotly_chart(charts.length_distribution_figure(distribution), key="lengths")
