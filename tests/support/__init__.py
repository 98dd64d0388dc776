"""Helpers shared by the test tiers (``tests/unit``, ``tests/integration``); no tests here."""
