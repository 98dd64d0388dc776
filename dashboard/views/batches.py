"""Batch sizes: speedup against batch size (the crossover) and the throughput/latency frontier."""

from __future__ import annotations

import streamlit as st

from dashboard import batches, charts, data

context: data.DashboardContext = st.session_state[data.CONTEXT_KEY]
trials = context.trials

st.header("Batch sizes")
if not batches.has_batches(trials):
    st.info(
        "These trials ran at batch size 1 only. List several in the sweep file "
        "(`batch_sizes: [1, 4, 16]`) to see where speculation stops paying."
    )
    st.stop()

headline = data.speeds(trials)[0]
st.subheader("Speedup vs batch size")
st.caption(
    f"Each policy's best setting at each batch size, per pair (mean {headline.label} speedup "
    "over the AR baseline decoded at the same batch size, per sequence). Where a line crosses "
    "the dashed line, speculation stops paying; `python -m orchestrator schedule` writes the "
    "best static K per batch size as a vLLM or TensorRT-LLM schedule."
)
best = batches.speedup_by_batch(trials, headline.speedup)
if best.empty:
    st.info("No speedups yet: the AR baselines of these trials have not finished.")
else:
    st.plotly_chart(
        charts.batch_speedup_figure(best, headline.speedup, headline.label), key="batch-speedup"
    )

st.subheader("Throughput vs latency")
st.caption(
    "Every setting through its batch sizes: total tokens/s (the batch's tokens over its wall "
    "time) against per-sequence tokens/s (each sequence's tokens over its own time in the "
    "batch, prefill and waiting included). Up is more throughput, right is faster for a user."
)
points = batches.batch_frontier(trials)
if points.empty:
    st.info("No trial of this selection stored its total tokens/s.")
else:
    st.plotly_chart(charts.throughput_latency_figure(points), key="batch-frontier")
