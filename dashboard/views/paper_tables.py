"""The papers' tables (AdaEDL, SpecDec++, SVIP, AdaSPEC) over the selected trials, as CSV too."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard import data, tables, trial_compare

context: data.DashboardContext = st.session_state[data.CONTEXT_KEY]
trials = context.trials
cache = st.cache_data(ttl=data.CACHE_TTL_S, show_spinner=False)
cached_job_kinds = cache(data.load_draft_job_kinds)
cached_runs = cache(trial_compare.load_runs)
cached_samples = cache(data.load_sweep_samples)


def show_table(table: pd.DataFrame, file_name: str) -> None:
    """Draw ``table`` (rounded for reading) and a button downloading it in full as CSV."""
    st.dataframe(table.round(3), hide_index=True)
    st.download_button(
        "Download CSV",
        tables.table_csv(table),
        file_name=file_name,
        mime="text/csv",
        key=f"csv-{file_name}",
        on_click="ignore",
        icon=":material/download:",
    )


st.header("Tables")
available = data.speeds(trials)
speed = st.radio(
    "Speed",
    available,
    format_func=lambda shown: shown.label,
    horizontal=True,
    help="decode-only leaves each prompt's prefill out (the seed papers' measure); end-to-end "
    "includes it. Trials stored before prefill and decode were timed apart have end-to-end only.",
)
if len(available) == 1:
    st.info("These trials were stored without decode seconds: end-to-end figures only.")

st.subheader("Best setting per policy, chosen on dev prompts, measured on test prompts")
st.caption(
    "Per pair, draft kind, dataset and temperature: the policy's trial with the best speedup on "
    "the dev prompts (a dataset entry's holdout), its speedup and paired 95% interval on the test "
    "prompts, decode-only where every trial has it. Without a holdout the best is chosen and "
    "measured on the same prompts, as the 'best: prompts' column says. Means of the policy's "
    "trials beside."
)
try:
    sweeps = (context.sweep,) if context.sweep else context.sweeps
    measured = cached_samples(context.url, sweeps, tuple(trials["trial_id"]))
except data.StoreUnavailable as error:
    st.warning(f"Cannot read the samples: {error}")
else:
    show_table(data.best_setting_table(trials, measured), "best_settings.csv")

st.caption(
    f"The papers' tables, {speed.label}. A policy's setting is its (threshold, max draft "
    "length); a cell is the mean over the trials of that setting that the sidebar keeps (seeds, "
    "pairs, temperatures), then the best setting, chosen and measured on the same prompts."
)
st.subheader("Tokens/s per policy × dataset, per max draft length (AdaEDL Table 1)")
for max_draft_len, table in tables.tokens_per_s_tables(trials, speed).items():
    st.markdown(f"**Max draft length {max_draft_len}** (best threshold per cell)")
    show_table(table, f"tokens_per_s_K{max_draft_len}.csv")

st.subheader("Best throughput per policy and dataset (SpecDec++ Table 1)")
st.caption("Tokens/s of each policy's best setting per dataset, over thresholds and max lengths.")
show_table(tables.best_throughput_table(trials, speed), "best_throughput.csv")

st.subheader("Speedup per policy × domain (SVIP Table 1)")
st.caption("One setting per policy for every dataset: the one with the best mean speedup.")
show_table(tables.speedup_by_domain_table(trials, speed), "speedup_by_domain.csv")

st.subheader("Acceptance rate per draft × dataset (AdaSPEC Table 1)")
drafting_policies = sorted(trials.loc[~trials["is_baseline"], "policy"].unique())
policy = st.selectbox(
    "Drafting rule the acceptance is measured with",
    drafting_policies,
    index=drafting_policies.index("static") if "static" in drafting_policies else 0,
)
if not tables.has_kd_drafts(trials):
    st.info(
        "No knowledge-distilled drafts in this selection: the table shows the base drafts only. "
        "Add a `training_jobs` entry of kind `distillspec` or `adaspec` and a pair with "
        "`draft: {job: NAME}` to compare KD methods."
    )
try:
    job_kinds = cached_job_kinds(context.url)
except data.StoreUnavailable as error:
    st.warning(f"Cannot read the training jobs: {error}")
    job_kinds = {}
show_table(tables.kd_acceptance_table(trials, job_kinds, policy), "kd_acceptance.csv")

st.subheader("Every trial with its 95% intervals")
st.caption(
    "t interval on the log figure with the jackknife standard error over the trial's prompts "
    "(n = the trial's samples); the speedup's leaves each prompt out of the trial and its AR "
    "baseline at once. A trial of fewer than 2 prompts has none (an interval needs at least 2)."
)
show_table(tables.trial_interval_table(trials), "trial_intervals.csv")

st.subheader("Provenance")
st.caption(
    "The runs that measured these trials: code commit (dirty: uncommitted changes, staged or "
    "not; empty: could not be told), library versions, device and the driver's torch threads."
)
try:
    runs = cached_runs(context.url, tuple(trials["run_id"].dropna().astype(int)))
except data.StoreUnavailable as error:
    st.warning(f"Cannot read the runs: {error}")
else:
    unknown = int(trials["run_id"].isna().sum())
    if unknown:
        st.info(f"{unknown} trial(s) ran before provenance was recorded.")
    if len(runs) > 1:
        st.warning(f"These trials come from {len(runs)} runs: check that they are comparable.")
    st.dataframe(runs, hide_index=True)
