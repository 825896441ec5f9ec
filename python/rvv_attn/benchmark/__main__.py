"""``python -m rvv_attn.benchmark``: see ``rvv_attn.benchmark.cli``."""

from __future__ import annotations

from .cli import main

raise SystemExit(main())
