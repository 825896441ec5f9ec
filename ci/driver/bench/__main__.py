"""``python -m driver.bench plot <bench.json> <out.png>``: the plot, drawn where matplotlib is installed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from .render import plot

if len(sys.argv) != 4 or sys.argv[1] != "plot":
    raise SystemExit("usage: python -m driver.bench plot <bench.json> <out.png>")
plot(json.loads(Path(sys.argv[2]).read_text()), Path(sys.argv[3]))
