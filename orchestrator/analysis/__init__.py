"""Analysing a sweep: statistics, metrics, paired comparisons, reports and the cost model."""
