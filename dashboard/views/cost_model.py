"""Cost model: the fits the runner stored per trial group, round-level and run-level."""

from __future__ import annotations

import streamlit as st

from dashboard import charts, data, fits

context: data.DashboardContext = st.session_state[data.CONTEXT_KEY]
cache = st.cache_data(ttl=data.CACHE_TTL_S, show_spinner=False)
cached_fits = cache(fits.load_cost_fits)

st.header("Cost model")
st.caption(
    "The fits stored by the sweep runs, one per trial group (pair, dataset, temperature, output "
    "length); this page fits nothing itself. Round-level: a round costs t_draft per draft "
    "forward, and t_target + t_per_verified per drafted token for its verify call. Run-level "
    "(SpecDec++): trial seconds = t_draft·N_draft + t_target·N_target over the group's trials. "
    "Both are scored on the trials' seconds (R², mean relative error); 'projection_fit' is the "
    "better one, which `python -m orchestrator fits` projects with."
)
try:
    stored = cached_fits(context.url, context.sweep)
except data.StoreUnavailable as error:
    st.warning(f"Cannot read the cost fits: {error}")
    st.stop()
if stored.empty:
    st.info(
        "No cost fits stored for this selection: the sweep ran with record_rounds: false, its "
        "rounds could not identify the costs, or it ran before fits were stored."
    )
    st.stop()
shown = stored.reindex(columns=list(fits.FIT_COLUMNS))
if len(shown) == 1:
    fit = shown.iloc[0]
    columns = st.columns(4)
    columns[0].metric("t_draft", f"{fit['t_draft'] * 1e3:.3f} ms")
    columns[1].metric("t_target", f"{fit['t_target'] * 1e3:.3f} ms")
    columns[2].metric("R² round fit (trials)", f"{fit['round_trial_r2']:.3f}")
    columns[3].metric("R² run fit", f"{fit['run_r2']:.3f}")
st.dataframe(shown.round(6), hide_index=True)
totals = fits.fit_totals(stored, context.trials)
if not totals.empty:
    st.plotly_chart(charts.cost_fit_figure(totals), key="cost")
