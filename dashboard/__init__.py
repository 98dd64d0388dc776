"""The read-only Streamlit dashboard: short pages over tested functions that read the store."""
