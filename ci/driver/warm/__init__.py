"""Warm targets: a long-lived emulated Python per configuration that runs each request in a fresh fork.

- ``targets``: the host side: starting, listing and stopping targets, and routing a cold command to one;
- ``guest``: the server that runs inside the emulated target (standard library only);
- ``client``: the host-side script a routed command runs, speaking the guest's wire format.
"""

from .targets import Target, ping, route, run_session

__all__ = ["Target", "ping", "route", "run_session"]
