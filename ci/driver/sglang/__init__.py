"""SGLang's released package beside rvv-attn, and the test-sglang session (docs/sglang-environment.md).

- ``environment``: the table (toolchains/sglang.json), the pinned wheels, the target's sysroot and its cached
  site folder with the stand-ins, the host's pins;
- ``session``: test-sglang, the tests marked ``sglang`` on the host and under QEMU.
"""

from . import environment, session
from .session import run_session

__all__ = ["environment", "run_session", "session"]
