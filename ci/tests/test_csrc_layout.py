"""The layers of csrc/ include strictly downward: ops -> dispatch -> the kernel seam -> kernels.

A kernel translation unit that pulls in a torch header takes the best part of
a minute per VLEN to compile instead of seconds, and would tie the kernels to
torch's ABI; dispatch stays torch-free so that it can be reasoned about (and
tested) as plain C++.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

CSRC = Path(__file__).resolve().parents[2] / "csrc"
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]', re.MULTILINE)
TORCH_HEADERS = ("torch/", "ATen/", "c10/", "caffe2/", "pybind11/", "Python.h")
SEAM = "kernels/kernel_api.h"

# Folder -> the project headers ("..." includes) its files may name.
ALLOWED = {
    "kernels": lambda h: h.startswith("kernels/"),
    "dispatch": lambda h: h.startswith("dispatch/") or h == SEAM or h == "variants.inc",
    "ops": lambda h: h.startswith(("ops/", "dispatch/")) or h == SEAM,
}
TORCH_FREE = ("kernels", "dispatch")


def _sources() -> list[Path]:
    return sorted(p for p in CSRC.rglob("*") if p.suffix in (".h", ".cpp"))


def _includes(path: Path) -> list[tuple[str, str]]:
    return INCLUDE.findall(path.read_text())


def test_every_source_is_in_a_layer_folder():
    assert _sources(), f"no sources found under {CSRC}"
    stray = [str(p.relative_to(CSRC)) for p in _sources() if p.parent.name not in ALLOWED or p.parent.parent != CSRC]
    assert not stray, f"csrc/ sources outside {sorted(ALLOWED)}: {stray}"


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(CSRC)))
def test_includes_point_downward(path: Path):
    layer = path.parent.name
    allowed = ALLOWED.get(layer, lambda h: False)
    bad = [h for kind, h in _includes(path) if kind == '"' and not allowed(h)]
    assert not bad, f"csrc/{layer}/{path.name} includes {bad}, outside what csrc/{layer}/ may include"
    if layer in TORCH_FREE:
        torch = [h for kind, h in _includes(path) if kind == "<" and h.startswith(TORCH_HEADERS)]
        assert not torch, f"csrc/{layer}/{path.name} includes torch headers {torch}"


def test_only_the_vocabulary_header_includes_a_vector_backend():
    backends = {"kernels/vec_rvv.h", "kernels/vec_portable.h"}
    users = {str(p.relative_to(CSRC)) for p in _sources() for _, h in _includes(p) if h in backends}
    assert users == {"kernels/vec.h"}, f"vector backends included by {sorted(users)}; kernels include kernels/vec.h"
