"""The stand-ins the wheel gives SGLang for Triton and xgrammar, and the start-up hook that installs them.

No SGLang needed: the router is checked with importer names, the stand-ins
directly, and the hook in a child interpreter with a package named
``sglang`` that only records what it finds.
"""

from __future__ import annotations

import builtins
import importlib.util
import inspect
import json
import os
import subprocess
import sys
import textwrap

import pytest

from rvv_attn.sglang_plugin import standins

pytestmark = pytest.mark.variant_independent

# What this environment lacks, and so what the start-up hook routes (a CUDA build of torch brings the real Triton).
MISSING = [name for name in standins.STAND_INS if importlib.util.find_spec(name) is None]


@pytest.fixture
def router(monkeypatch):
    """``standins`` with both names routed, restored afterwards (the routing is process-wide)."""
    monkeypatch.setattr(builtins, "__import__", builtins.__import__)
    monkeypatch.setattr(standins, "_routed", set())
    standins.install()
    return standins


def test_router_serves_the_stand_ins_to_sglang_only(router):
    triton = router._import("triton", {"__name__": "sglang.srt.utils.common"})
    assert triton.__name__ == f"{standins.__name__}.triton" and triton.STAND_IN
    tl = router._import("triton.language", {"__name__": "sglang.x"})
    assert tl is triton  # `import triton.language as tl` then walks the attributes
    extra = router._import("triton.language.extra", {"__name__": "sglang.x"}, None, ("libdevice",))
    assert extra.libdevice.__name__.endswith("libdevice")
    # Any other importer gets the real import system: json stays json, and no stand-in for torch.
    assert router._import("json", {"__name__": "sglang.x"}) is json
    if "triton" in MISSING:
        with pytest.raises(ImportError):
            router._import("triton", {"__name__": "torch._dynamo.utils"})
        assert "triton" not in sys.modules
    assert "xgrammar" not in sys.modules


@pytest.mark.skipif("triton" not in MISSING, reason="this environment has the real Triton")
def test_only_the_names_asked_for_are_routed(monkeypatch):
    monkeypatch.setattr(builtins, "__import__", builtins.__import__)
    monkeypatch.setattr(standins, "_routed", set())
    standins.install(["xgrammar"])
    assert standins.routed() == ("xgrammar",)
    with pytest.raises(ImportError):
        standins._import("triton", {"__name__": "sglang.x"})
    with pytest.raises(ValueError, match="no stand-in for cuda"):
        standins.install(["cuda"])


def test_triton_kernels_take_sglangs_decorators_and_refuse_to_run(router):
    triton = router._import("triton", {"__name__": "sglang.x"})
    tl = triton.language

    @triton.autotune(configs=[triton.Config({"BLOCK": 16}, num_warps=2)], key=["n"])
    @triton.heuristics({"EVEN": lambda args: args["n"] % 2 == 0})
    @triton.jit
    def kernel(x, n, BLOCK: tl.constexpr) -> tl.uint32:  # noqa: N803 - Triton's style
        return x

    @triton.jit(do_not_specialize=["x"])
    def other(x: tl.tensor):
        return x

    for launch in (kernel, kernel[(1,)], other):
        with pytest.raises(triton.StandInError, match="no riscv64 build"):
            launch(1)
    assert kernel.configs[0].kwargs == {"BLOCK": 16} and kernel.configs[0].num_warps == 2
    assert "cache_results" in inspect.signature(triton.autotune).parameters  # SGLang's fla utils look for it
    assert repr(tl.bfloat16) == "triton.language.bfloat16"
    assert [triton.cdiv(n, 4) for n in (0, 1, 4, 5)] == [0, 1, 1, 2]
    assert [triton.next_power_of_2(n) for n in (1, 2, 3, 17, 64)] == [1, 2, 4, 32, 64]


# The xgrammar stand-in's request types are pydantic models: pydantic comes with SGLang's environment.
@pytest.mark.sglang
def test_every_use_of_the_xgrammar_stand_in_names_it(router):
    xgrammar = router._import("xgrammar", {"__name__": "sglang.srt.function_call.inkling_detector"}, None, ("x",))
    assert xgrammar.STAND_IN
    formats = router._import("xgrammar.structural_tag", {"__name__": "sglang.x"}, None, ("TagFormat",))
    from pydantic import ValidationError

    for use in (
        lambda: xgrammar.GrammarCompiler(None),
        lambda: xgrammar.TokenizerInfo.from_huggingface(None),
        lambda: xgrammar.get_bitmask_shape(4, 8),
        lambda: xgrammar.apply_token_bitmask_inplace(None, None),
        lambda: formats.TagFormat(begin="<a>", content=None, end="</a>"),  # a pydantic model: its validation
        lambda: xgrammar.StructuralTag.model_validate({"format": {}}),
    ):
        with pytest.raises((xgrammar.StandInError, ValidationError), match="xgrammar is not installed"):
            use()


@pytest.mark.sglang
def test_xgrammar_models_fit_in_pydantic_requests_and_fail_validation_clearly(router):
    """SGLang's OpenAI protocol puts StructuralTag in a Union field: the model must build, a request asking for
    it must get a validation error naming xgrammar, and one without it must validate."""
    from pydantic import BaseModel, ValidationError

    xgrammar = router._import("xgrammar", {"__name__": "sglang.x"}, None, ("StructuralTag",))

    class Request(BaseModel):
        response_format: dict | xgrammar.StructuralTag | None = None

    assert Request().response_format is None
    with pytest.raises(ValidationError, match="xgrammar is not installed"):
        Request(response_format=[{"begin": "<a>"}])


def test_the_start_up_hook_and_the_router_name_the_same_stand_ins():
    import _rvv_attn_sglang_startup as hook

    assert hook.STAND_INS == standins.STAND_INS


@pytest.mark.host_only  # a child interpreter (torch's import) per case; SGLang's target runs the hook for real
@pytest.mark.parametrize("switch", ["", "0"])
def test_the_start_up_hook_routes_sglangs_imports_when_it_first_imports(tmp_path, switch):
    (tmp_path / "sglang").mkdir()
    # A package named sglang that records, while it is being imported, what an import of triton gives it.
    (tmp_path / "sglang" / "__init__.py").write_text(
        textwrap.dedent(
            """
            try:
                import triton
                GOT = triton.__name__
            except ImportError:
                GOT = None
            """
        )
    )
    probe = textwrap.dedent(
        """
        import json, sys
        import _rvv_attn_sglang_startup  # as the .pth does at start
        before = "rvv_attn" in sys.modules
        import sglang
        from rvv_attn.sglang_plugin import standins
        print(json.dumps({"before": before, "got": sglang.GOT, "routed": list(standins.routed()),
                          "triton_registered": "triton" in sys.modules}))
        """
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "RVV_ATTN_SGLANG_STANDINS": switch}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["before"] is False, "the hook must not import rvv_attn (nor torch) before SGLang is imported"
    assert report["triton_registered"] is ("triton" not in MISSING)
    if switch == "0":
        assert report["routed"] == []
        assert report["got"] == (None if "triton" in MISSING else "triton")
    else:
        assert set(report["routed"]) == set(MISSING)
        assert report["got"] == (f"{standins.__name__}.triton" if "triton" in MISSING else "triton")
