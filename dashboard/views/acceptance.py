"""Acceptance: per-position acceptance rate and the accepted-length histogram per policy."""

from __future__ import annotations

import streamlit as st

from dashboard import acceptance, charts, data

context: data.DashboardContext = st.session_state[data.CONTEXT_KEY]
trials = context.trials
cache = st.cache_data(ttl=data.CACHE_TTL_S, show_spinner=False)
cached_positions = cache(acceptance.load_position_acceptance)
cached_lengths = cache(acceptance.load_accepted_lengths)

st.header("Acceptance")
ids = tuple(trials["trial_id"])
try:
    positions = cached_positions(context.url, ids)
    lengths = cached_lengths(context.url, ids)
except data.StoreUnavailable as error:
    st.warning(f"Cannot read the acceptance tables: {error}")
    st.stop()

st.subheader("Acceptance rate per draft position")
st.caption(
    "vLLM's definition: of the rounds that drafted a token at position i, the share in which it "
    "was accepted; counts pooled over each policy's selected trials."
)
rates = acceptance.position_rates(positions, trials)
if rates.empty:
    st.info("No drafted tokens recorded for these trials (or they ran before this was stored).")
else:
    st.plotly_chart(charts.position_acceptance_figure(rates), key="positions")
    st.dataframe(rates.round(4), hide_index=True)

st.subheader("Accepted draft tokens per round")
shares = acceptance.accepted_length_shares(lengths, trials)
if shares.empty:
    st.info("No accepted-length histogram stored for these trials.")
else:
    st.plotly_chart(charts.accepted_length_figure(shares), key="accepted-lengths")
