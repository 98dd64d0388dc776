"""Pareto frontiers: speedup vs mean drafted length, verification rate vs discard rate."""

from __future__ import annotations

import streamlit as st

from dashboard import charts, data

context: data.DashboardContext = st.session_state[data.CONTEXT_KEY]
points = data.config_points(context.trials)

st.header("Pareto frontiers")
st.caption(
    "One point per policy setting (threshold, max draft length), averaged over the trials the "
    "sidebar keeps; each policy's line joins its Pareto-optimal settings. Hover a point for its "
    "configuration. Where the trials have drafts of several kinds (a draft model, an n-gram "
    "lookup), each policy has a point set and line per kind: 'policy (kind)', a symbol per kind. "
    "Black stars: the greedy oracle (temperature 0 only); grey ×: the AR baseline. "
    "Error bars: 95% intervals of the speedup. A point of one trial shows its stored "
    "interval (paired with the baseline's prompts); a point averaging k trials shows the mean "
    "± √(Σ half-width²)/k of theirs (independent trials, normal approximation)."
)

headline = data.speeds(context.trials)[0]
st.subheader("Speedup vs mean drafted length")
st.caption(
    f"Better is up and left: more speedup for fewer drafted tokens per round. Speedups "
    f"{headline.label} (decode-only where every trial stored its decode seconds)."
)
speed = data.mark_frontiers(
    points, "mean_drafted", headline.speedup, maximise_x=False, maximise_y=True
)
st.plotly_chart(
    charts.frontier_figure(
        speed,
        "mean_drafted",
        headline.speedup,
        ("mean drafted tokens per round", f"{headline.label} speedup over AR"),
        speedup_reference=True,
    ),
    key="frontier-speedup",
)

st.subheader("Verification rate vs discard rate")
st.caption(
    "SpecDec++'s hardware-independent view: target calls per generated token against discarded "
    "draft tokens per generated token; lower is better on both."
)
rates = data.mark_frontiers(
    points, "discard_rate", "verification_rate", maximise_x=False, maximise_y=False
)
st.plotly_chart(
    charts.frontier_figure(
        rates, "discard_rate", "verification_rate", ("discard rate", "verification rate")
    ),
    key="frontier-rates",
)

with st.expander("Settings on a frontier"):
    columns = [
        "policy",
        "draft_kind",
        "threshold",
        "max_draft_len",
        "n_trials",
        *data.METRIC_COLUMNS,
    ]
    front = speed[speed["on_front"] | speed["is_baseline"]][columns]
    st.dataframe(front.round(4), hide_index=True)
