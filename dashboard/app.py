"""SpecSweep dashboard: pictures of the results store, opened read-only.

Run from the repository root::

    streamlit run dashboard/app.py --server.address 127.0.0.1 -- --db sqlite:///results.db

Without ``--db`` the store is ``$SPECSWEEP_DB``, else ``sqlite:///results.db`` (the CLI's
default). ``dashboard/.streamlit/config.toml`` binds the server to 127.0.0.1 and runs it
headless; pass ``--server.address 0.0.0.0`` to serve other machines on purpose. This script
reads the store, draws the sidebar filters and hands a ``DashboardContext`` to the page the
user picked; the pages in ``views/`` only draw (not ``pages/``, which Streamlit would
also run on their own as a classic multipage app, without this context).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import streamlit as st

from dashboard import data

PAGES = (
    ("views/frontiers.py", "Pareto frontiers", ":material/insights:"),
    ("views/paper_tables.py", "Tables", ":material/table_chart:"),
    ("views/robustness.py", "Robustness", ":material/thermostat:"),
    ("views/acceptance.py", "Acceptance", ":material/done_all:"),
    ("views/cost_model.py", "Cost model", ":material/timer:"),
    ("views/compare.py", "Compare sweeps", ":material/compare_arrows:"),
    ("views/compare_trials.py", "Compare trials", ":material/balance:"),
    ("views/batches.py", "Batch sizes", ":material/stacked_line_chart:"),
)
ALL_TRIALS = "(all trials)"
STATUSES = ("done", "pending", "running", "failed")
FILTERS = (
    ("pairs", "Pair"),
    ("datasets", "Dataset"),
    ("temperatures", "Temperature"),
    ("max_draft_lens", "Max draft length"),
    ("batch_sizes", "Batch size"),
)

cached_sweep_names = st.cache_data(ttl=data.CACHE_TTL_S, show_spinner=False)(data.load_sweep_names)
cached_trials = st.cache_data(ttl=data.CACHE_TTL_S, show_spinner=False)(data.load_trials)


def script_arguments() -> list[str]:
    """Return the arguments after ``--`` of ``streamlit run`` ([] under pytest's AppTest).

    ``streamlit run`` sets ``sys.argv`` to this script's path plus those arguments; in any
    other process ``sys.argv`` belongs to someone else and is ignored.
    """
    if sys.argv and Path(sys.argv[0]).resolve() == Path(__file__).resolve():
        return sys.argv[1:]
    return []


def sidebar_filters(trials: pd.DataFrame, sweep: str | None) -> data.TrialFilters:
    """Draw the sidebar's multiselects and return the filters (all chosen = no restriction)."""
    options = data.filter_options(trials)
    chosen = {}
    for name, label in FILTERS:
        values = st.sidebar.multiselect(
            label,
            options[name],
            default=options[name],
            key=f"filter-{name}-{sweep}",
            help="Leave empty for all.",
        )
        chosen[name] = () if len(values) in (0, len(options[name])) else tuple(values)
    return data.TrialFilters(**chosen)


def load_context(url: str) -> data.DashboardContext | None:
    """Read the store and the sidebar; return the pages' context, or None after a message."""
    shown = data.display_url(url)
    st.sidebar.caption(f"Store (read-only): `{shown}`")
    try:
        sweeps = cached_sweep_names(url)
        everything = cached_trials(url, None)
    except data.StoreUnavailable as error:
        st.warning(
            f"Cannot read the results store at `{shown}`: {error}.\n\n"
            f"Fill it by running a sweep: `{data.fill_hint(url)}`, or point the dashboard at "
            "another store: `streamlit run dashboard/app.py -- --db URL`."
        )
        return None
    if everything.empty:
        st.info(
            f"The results store at `{shown}` holds no trials yet. "
            f"Fill it by running a sweep: `{data.fill_hint(url)}`."
        )
        return None
    choice = st.sidebar.selectbox("Sweep", [*reversed(sweeps), ALL_TRIALS])
    sweep = None if choice == ALL_TRIALS else choice
    trials = everything if sweep is None else cached_trials(url, sweep)
    counts = trials["status"].value_counts()
    st.sidebar.caption(" · ".join(f"{counts.get(status, 0)} {status}" for status in STATUSES))
    done = data.done_trials(trials)
    if done.empty:
        st.info(f"No finished trials in `{choice}` yet: {len(trials)} are pending or failed.")
        return None
    filters = sidebar_filters(done, sweep)
    selected = data.apply_filters(done, filters)
    if selected.empty:
        st.info("No finished trial matches the sidebar filters.")
        return None
    return data.DashboardContext(url, sweep, tuple(sweeps), filters, selected)


def main() -> None:
    """Route to the chosen page with the context, or show why the store cannot be shown."""
    st.set_page_config(page_title="SpecSweep", page_icon=":material/speed:", layout="wide")
    page = st.navigation([st.Page(path, title=title, icon=icon) for path, title, icon in PAGES])
    url = data.db_argument(script_arguments()) or data.default_url()
    context = load_context(url)
    if context is not None:
        st.session_state[data.CONTEXT_KEY] = context
        page.run()


main()
