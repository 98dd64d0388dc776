"""Compare two sweeps: per policy × dataset, each metric in A, in B, and B − A."""

from __future__ import annotations

import streamlit as st

from dashboard import charts, data, tables

context: data.DashboardContext = st.session_state[data.CONTEXT_KEY]
cache = st.cache_data(ttl=data.CACHE_TTL_S, show_spinner=False)
cached_trials = cache(data.load_trials)

st.header("Compare sweeps")
if len(context.sweeps) < 2:
    st.info("The store holds fewer than two sweeps: submit another sweep to compare with.")
    st.stop()

newest_first = list(reversed(context.sweeps))
left, right = st.columns(2)
sweep_a = left.selectbox("Sweep A", newest_first, index=1)
sweep_b = right.selectbox("Sweep B", newest_first, index=0)
metrics = st.multiselect(
    "Metrics",
    list(data.METRIC_COLUMNS),
    default=["decode_tokens_per_s", "decode_speedup", "tokens_per_s", "speedup", "acceptance_rate"],
)
st.caption(
    "Means over each sweep's finished trials per policy × dataset (all settings), after the "
    "sidebar's pair, dataset, temperature and max-length filters; Δ = B − A."
)
if not metrics:
    st.info("Choose at least one metric.")
    st.stop()
try:
    sides = [
        data.apply_filters(data.done_trials(cached_trials(context.url, sweep)), context.filters)
        for sweep in (sweep_a, sweep_b)
    ]
except data.StoreUnavailable as error:
    st.warning(f"Cannot read the sweeps: {error}")
    st.stop()
table = data.compare_sweeps(sides[0], sides[1], metrics)
st.dataframe(table.round(4), hide_index=True)
st.download_button(
    "Download CSV",
    tables.table_csv(table),
    file_name=f"compare_{sweep_a}_vs_{sweep_b}.csv",
    mime="text/csv",
    on_click="ignore",
    icon=":material/download:",
)
if not table.empty:
    st.plotly_chart(charts.comparison_figure(table, metrics[0]), key="compare")
