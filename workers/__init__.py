"""Decoding: the speculative-decoding engine, the models and the Ray actors that run them."""
