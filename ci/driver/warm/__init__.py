"""Warm targets: a long-lived emulated Python per configuration that runs each request in a fresh fork."""
