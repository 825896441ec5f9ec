"""The GitHub Actions matrices, printed as ``name=<json>`` lines for $GITHUB_OUTPUT.

Printed by ``./ci/nox -s ci-matrix >> "$GITHUB_OUTPUT"``: the
workflow's VLEN lists come from toolchains/vlens.json like everything else.
"""

from __future__ import annotations

import json

from ..toolchain import vlens
from . import install_test


def install_matrix() -> str:
    """One install-test job per VLEN of the table (the run without V is a job of its own)."""
    rows = [{"config": c.name} for c in install_test.configurations() if c.vlen]
    return json.dumps({"include": rows})


def outputs() -> str:
    return f"emulated={vlens.github_matrix()}\ninstall={install_matrix()}\n"


if __name__ == "__main__":
    print(outputs(), end="")
