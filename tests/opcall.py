"""One way for every test to call an operator: snapshot before, check every byte after.

``call(op, args, writes)`` copies, before the call, the whole storage behind
every tensor argument (so the padding of a strided view's base tensor is
included), runs the operator, and then checks byte for byte that

* an argument the operator's schema does not declare as written (``Tensor(a!)``)
  is unchanged, and so is the rest of its storage;
* a declared output changed only inside the region the test documents in
  ``writes`` (a bool mask shaped like the argument: the ``loc`` rows of the
  cache, the sequences' rows of ``o_extend``, ...); outside it, and outside
  the view in its base tensor, nothing changed;
* a call that raised changed nothing at all.

It returns the arguments' values as they were before the call, so expected
results are computed from the inputs the operator saw, not from what it left
behind. ``embed`` builds the strided views the tests use: a copy of the data
inside a larger base tensor filled with a sentinel that a stray store
overwrites (and that a stray read turns into NaN or a huge value).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch

# Sentinels of the base tensors around strided views: NaN for floats (a read
# of it poisons the result), -128 for int8 (the quantizer clamps to
# [-127, 127], so the cache never holds it), an invalid slot for indices.
SENTINEL = {
    torch.float32: float("nan"),
    torch.bfloat16: float("nan"),
    torch.float16: float("nan"),
    torch.float64: float("nan"),
    torch.int8: -128,
    torch.int32: -(2**31),
    torch.int64: -(2**62),
}


def embed(
    x: torch.Tensor,
    lead: Sequence[int],
    trail: Sequence[int] | None = None,
    step: Sequence[int] | None = None,
    swap: tuple[int, int] | None = None,
    sentinel: float | None = None,
) -> torch.Tensor:
    """``x`` copied into a view of a larger sentinel-filled tensor.

    Per dimension i the base has ``lead[i]`` sentinel elements before the view,
    ``trail[i]`` after it (default: as many as before), and every
    ``step[i]``-th element is the view's. ``swap=(i, j)`` lays the base out with
    dimensions i and j exchanged, so the view's strides are not in decreasing order.
    """
    n = x.dim()
    trail = list(lead) if trail is None else list(trail)
    step = [1] * n if step is None else list(step)
    shape = [lead[i] + step[i] * x.shape[i] + trail[i] for i in range(n)]
    fill = SENTINEL[x.dtype] if sentinel is None else sentinel
    if swap is None:
        base = torch.full(shape, fill, dtype=x.dtype)
    else:
        i, j = swap
        shape[i], shape[j] = shape[j], shape[i]
        base = torch.full(shape, fill, dtype=x.dtype).transpose(i, j)
    view = base[tuple(slice(lead[i], lead[i] + step[i] * x.shape[i], step[i]) for i in range(n))]
    view.copy_(x)
    return view


def written_arguments(op) -> frozenset[str]:
    """The tensor arguments the operator's schema declares as written (``Tensor(a!)``)."""
    schema = op.default._schema
    return frozenset(a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write)


def rows(t: torch.Tensor, indices) -> torch.Tensor:
    """A writes mask: rows ``indices`` (along dim 0) of ``t``, whole."""
    mask = torch.zeros(t.shape, dtype=torch.bool)
    idx = torch.as_tensor(indices).to(torch.int64).reshape(-1)
    # Out-of-range indices belong to calls that must be rejected (and write nothing).
    idx = idx[(idx >= 0) & (idx < t.shape[0])] if t.dim() else idx[:0]
    if idx.numel():
        mask[idx] = True
    return mask


def everything(t: torch.Tensor) -> torch.Tensor:
    """A writes mask: the whole view."""
    return torch.ones(t.shape, dtype=torch.bool)


def _storage_bytes(t: torch.Tensor) -> torch.Tensor:
    """A flat uint8 tensor over the whole storage behind ``t`` (shares memory)."""
    return torch.empty(0, dtype=torch.uint8).set_(t.untyped_storage())


def _byte_positions(t: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """For each element of ``t`` (or each one ``mask`` selects), the storage byte offsets it occupies:
    [*t.shape, element_size] (or [selected, element_size])."""
    size = t.element_size()
    elements = torch.arange(t.untyped_storage().nbytes() // size, dtype=torch.int64)
    index = torch.as_strided(elements, t.shape, t.stride(), t.storage_offset())
    if mask is not None:
        index = index[mask]  # select before widening to bytes: a cache is millions of elements
    return index[..., None] * size + torch.arange(size)


class _Storage:
    """One storage shared by one or more arguments: its bytes before the call, and who may write where."""

    def __init__(self, t: torch.Tensor):
        self.live = _storage_bytes(t)
        self.before = self.live.clone()
        self.allowed = torch.zeros(self.live.shape, dtype=torch.bool)
        self.args: list[tuple[str, torch.Tensor]] = []

    def where(self, byte: int) -> str:
        for name, t in self.args:
            hit = (_byte_positions(t) == byte).any(-1).nonzero()
            if hit.numel():
                return f"{name}[{', '.join(str(int(i)) for i in hit[0])}]"
        names = " / ".join(name for name, _ in self.args)
        return f"byte {byte} of the base tensor of {names}, outside the view"


def call(op, args: Mapping[str, object], writes: Mapping[str, torch.Tensor] | None = None) -> dict[str, object]:
    """Run ``op(**args)`` and check that only the documented bytes changed; return the arguments as they were.

    ``writes`` maps a written argument's name to a bool mask of the elements the
    operator may change (``rows``, ``everything``); a written argument without a
    mask must stay unchanged. Naming an argument the schema does not declare as
    written is a test bug and fails.
    """
    writes = dict(writes or {})
    declared = written_arguments(op)
    undeclared = set(writes) - declared
    assert not undeclared, f"{op}: {sorted(undeclared)} are not declared as written by the schema"
    storages: dict[int, _Storage] = {}
    for name, value in args.items():
        if not torch.is_tensor(value):
            continue
        key = value.untyped_storage().data_ptr()
        if value.untyped_storage().nbytes() == 0:
            continue
        storage = storages.setdefault(key, _Storage(value))
        storage.args.append((name, value))
        if name in writes:
            mask = writes[name]
            assert mask.shape == value.shape, (
                f"writes[{name!r}] has shape {tuple(mask.shape)}, not {tuple(value.shape)}"
            )
            storage.allowed[_byte_positions(value, mask).reshape(-1)] = True
    before = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in args.items()}
    try:
        op(**args)
    except BaseException:
        for storage in storages.values():
            storage.allowed.zero_()
        _check(op, storages, " by a rejected call")
        raise
    _check(op, storages, "")
    return before


def _check(op, storages: Mapping[int, _Storage], context: str) -> None:
    for storage in storages.values():
        stray = (storage.live != storage.before) & ~storage.allowed
        if stray.any():
            first = int(stray.nonzero()[0])
            count = int(stray.sum())
            raise AssertionError(
                f"{op}: {count} byte(s) changed where nothing may be written{context}; "
                f"the first at {storage.where(first)}"
            )


# ---- what each operator documents that it writes ------------------------------------------------
def _new_token_slots(a: Mapping[str, object]) -> list[int]:
    """Cache slots of extend's new tokens: req_to_token[req_pool_indices[b], enc_b + prefix_b + i] (none in
    cross attention)."""
    if a.get("is_cross_attn", False):
        return []
    slots = []
    m, pools = a["req_to_token"], a["req_pool_indices"]
    enc = a.get("encoder_lens")
    for b, (total, ext) in enumerate(zip(a["seq_lens"].tolist(), a["extend_seq_lens"].tolist())):
        row = int(pools[b])
        off = int(enc[b]) if enc is not None and b < enc.numel() else 0
        if not (0 <= row < m.shape[0]) or ext <= 0 or off < 0 or off + total > m.shape[1]:
            continue  # an invalid call: rejected, and then nothing may change
        slots += [int(s) for s in m[row, off + max(total - ext, 0) : off + total].tolist()]
    return slots


def owned_rows(a: Mapping[str, object]) -> list[int]:
    """Rows of o_extend some sequence owns: extend_start_loc[b] ..+ extend_seq_lens[b]."""
    return [
        r
        for start, n in zip(a["extend_start_loc"].tolist(), a["extend_seq_lens"].tolist())
        for r in range(start, start + max(n, 0))
    ]


def documented_writes(name: str, a: Mapping[str, object]) -> dict[str, torch.Tensor]:
    """The elements operator ``name`` may change, per its documentation, for arguments ``a``."""
    writes: dict[str, torch.Tensor] = {}
    if name == "decode_set_kv_buffer" or (name.startswith("decode_attention") and a.get("key") is not None):
        new_slots, new_rows = a["loc"], a["key"]
    elif name == "extend_attention_int8_cpu":
        new_slots, new_rows = _new_token_slots(a), a["k_extend"]
    else:
        new_slots, new_rows = None, None
    if new_slots is not None and name != "extend_attention_cpu":
        writes["k_buffer"] = rows(a["k_buffer"], new_slots)
        writes["v_buffer"] = rows(a["v_buffer"], new_slots)
    if name.endswith("int8_cpu") and new_rows is not None and new_rows.dtype != torch.int8:
        # Dynamic (NaN) scales of float rows are computed and stored; int8 rows come with the caller's.
        for side in ("k", "v"):
            if math.isnan(a[f"{side}_scale"]):
                writes[f"{side}_scale_buf"] = rows(a[f"{side}_scale_buf"], new_slots)
    if name.startswith("decode_attention"):
        writes["output"] = everything(a["output"])
        writes["attn_logits"] = everything(a["attn_logits"])
    if name.startswith("extend_attention"):
        o = a["o_extend"]
        writes["o_extend"] = rows(o, [r for r in owned_rows(a) if 0 <= r < o.shape[0]])
    return writes


def call_documented(name: str, a: Mapping[str, object]) -> dict[str, object]:
    """``call`` with the operator's documented writes."""
    import rvv_attn

    return call(getattr(rvv_attn.ops, name), a, documented_writes(name, a))


class CheckedOps:
    """``rvv_attn.ops`` for tests that call operators positionally: every call goes through ``call``
    with the operator's documented writes; operators that write nothing are returned as they are."""

    def __getattr__(self, name: str):
        import rvv_attn

        op = getattr(rvv_attn.ops, name)
        if not written_arguments(op):
            return op
        names = [arg.name for arg in op.default._schema.arguments]

        def checked(*args, **kwargs):
            a = dict(zip(names, args), **kwargs)
            call_documented(name, a)

        return checked
