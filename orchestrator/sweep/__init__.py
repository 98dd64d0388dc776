"""Defining a sweep: the YAML file checked into a typed spec, expanded into trials and units."""
