"""The cost model: fitting round costs, replaying trials on the fit, estimating a sweep's time."""
