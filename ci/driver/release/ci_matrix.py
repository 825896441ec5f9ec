"""The GitHub Actions matrices, printed as ``name=<json>`` lines for $GITHUB_OUTPUT.

Printed by ``./ci/nox -s ci-matrix >> "$GITHUB_OUTPUT"``: the
workflow's VLEN lists come from toolchains/vlens.json and its torch lines from
toolchains/torch_lines.json, like everything else.
"""

from __future__ import annotations

import json

from ..toolchain import torch_lines, vlens
from . import install_test


def install_matrix() -> str:
    """One install-test job per VLEN of the table and torch line (the runs without V are jobs of their own):
    the one release wheel is installed into each line's Python and torch."""
    rows = [
        {"config": c.name, "torch": line.torch}
        for line in torch_lines.lines()
        for c in install_test.configurations()
        if c.vlen
    ]
    return json.dumps({"include": rows})


def lines_matrix(lines: list[torch_lines.TorchLine]) -> str:
    """A matrix over ``lines``: every line (the install jobs without V), or those other than the default
    (their test-torchX.Y jobs)."""
    return json.dumps({"torch": [line.torch for line in lines]})


def outputs() -> str:
    matrices = {
        "emulated": vlens.github_matrix(),
        "install": install_matrix(),
        "lines": lines_matrix(torch_lines.lines()),
        "other_lines": lines_matrix(torch_lines.other_lines()),
    }
    return "".join(f"{name}={value}\n" for name, value in matrices.items())


if __name__ == "__main__":
    print(outputs(), end="")
