"""Training drafts, heads and predictors (Ray Train jobs) and building the model zoo."""
