"""Independent reference implementations in plain torch (float64 math).

Nothing here calls the kernels; tests compare the kernels against these.
"""

from __future__ import annotations

import math

import torch


def write_kv(
    k_buffer: torch.Tensor, v_buffer: torch.Tensor, key: torch.Tensor, value: torch.Tensor, loc: torch.Tensor
) -> None:
    """What decode_set_kv_buffer must do, by plain indexing."""
    for b, slot in enumerate(loc.tolist()):
        k_buffer[slot] = key[b]
        v_buffer[slot] = value[b]


def decode_attention(
    query: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float,
    logit_cap: float,
) -> torch.Tensor:
    """Decode attention in float64, one sequence at a time, over the whole score row.

    Sequence b's query heads attend over cache slots
    req_to_token[req_pool_indices[b], :seq_lens[b]]; query head h reads KV
    head h // (H / H_kv). Returns [B, H, Dv] float64.
    """
    batch, heads, _ = query.shape
    out = torch.empty(batch, heads, v_buffer.shape[2], dtype=torch.float64)
    for b in range(batch):
        length = int(seq_lens[b])
        slots = req_to_token[int(req_pool_indices[b]), :length].long()
        scores = _grouped_scores(query[b], k_buffer[slots], sm_scale, logit_cap)  # [H_kv, G, L]
        weights = torch.softmax(scores, dim=-1)
        out[b] = torch.einsum("kgl,lkd->kgd", weights, v_buffer[slots].double()).reshape(heads, -1)
    return out


def _scores(queries: torch.Tensor, keys: torch.Tensor, sm_scale: float, logit_cap: float) -> torch.Tensor:
    """Scaled dot products in float64 of queries [..., Q, D] with keys [..., K, D] (leading dims broadcast):
    [..., Q, K], soft-capped to logit_cap * tanh(score / logit_cap) when logit_cap > 0."""
    scores = queries.double() @ keys.double().transpose(-1, -2) * sm_scale
    if logit_cap > 0:
        scores = logit_cap * torch.tanh(scores / logit_cap)
    return scores


def _grouped_scores(query: torch.Tensor, keys: torch.Tensor, sm_scale: float, logit_cap: float) -> torch.Tensor:
    """Scores [H_kv, G, L] of one sequence's query [H, D] against its keys [L, H_kv, D]: query head
    h = k * G + g reads KV head k (the heads viewed as [H_kv, G], no copy of K per query head)."""
    heads_kv = keys.shape[1]
    grouped = query.reshape(heads_kv, query.shape[0] // heads_kv, query.shape[1])
    return _scores(grouped, keys.transpose(0, 1), sm_scale, logit_cap)


# Query rows per block of extend_attention's reference.
_REFERENCE_ROWS = 512


def extend_attention(
    q_extend: torch.Tensor,
    k_extend: torch.Tensor,
    v_extend: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    extend_seq_lens: torch.Tensor,
    extend_start_loc: torch.Tensor,
    sm_scale: float,
    logit_cap: float,
) -> torch.Tensor:
    """What extend_attention_cpu must compute, in float64, one sequence at a time.

    Returns a float64 tensor shaped like the output, [T, H, Dv]; rows that no
    sequence covers are NaN (the operator must leave them alone, which the
    tests check separately). Sequence b attends to its cached prefix (slots
    req_to_token[req_pool_indices[b], :prefix]) followed by its own new
    tokens, causally: new token i sees the prefix and new tokens 0..i.
    """
    tokens, heads, head_dim = q_extend.shape
    heads_kv, head_dim_v = v_extend.shape[1], v_extend.shape[2]
    group = heads // heads_kv
    out = torch.full((tokens, heads, head_dim_v), float("nan"), dtype=torch.float64)
    for b in range(seq_lens.shape[0]):
        ext = int(extend_seq_lens[b])
        prefix = int(seq_lens[b]) - ext
        start = int(extend_start_loc[b])
        if ext == 0:
            continue
        slots = req_to_token[int(req_pool_indices[b]), :prefix].long()
        rows = slice(start, start + ext)
        # [keys, H_kv, D] -> [H_kv, keys, D]; query head h = k * G + g reads KV head k.
        keys = torch.cat([k_buffer[slots], k_extend[rows]]).double().transpose(0, 1)
        values = torch.cat([v_buffer[slots], v_extend[rows]]).double().transpose(0, 1)
        # [ext, H, D] -> [H_kv, G, ext, D]
        queries = q_extend[rows].double().reshape(ext, heads_kv, group, head_dim).permute(1, 2, 0, 3)
        # Blocks of query rows, each scored only against the keys its last row can see (a long causal
        # extend would otherwise compute, then mask, half of a [ext, prefix + ext] score matrix).
        for i0 in range(0, ext, _REFERENCE_ROWS):
            i1 = min(i0 + _REFERENCE_ROWS, ext)
            seen = prefix + i1
            scores = _scores(queries[:, :, i0:i1], keys[:, None, :seen], sm_scale, logit_cap)  # [H_kv, G, rows, seen]
            # Query i (0-based among the new tokens) may see keys 0 .. prefix + i.
            visible = torch.arange(seen)[None, :] <= (prefix + torch.arange(i0, i1))[:, None]
            scores = scores.masked_fill(~visible, float("-inf"))
            block = torch.softmax(scores, dim=-1) @ values[:, None, :seen]  # [H_kv, G, i1 - i0, Dv]
            out[start + i0 : start + i1] = block.permute(2, 0, 1, 3).reshape(i1 - i0, heads, head_dim_v)
    return out


# ---- int8 KV cache ------------------------------------------------------------------------------
# Quantization as the int8 operators specify it: a static scale s > 0, or
# (scale None) a dynamic one per row s = max|x| / 127 computed in float32,
# replaced by 1.0 when it is 0 (an all-zero row). q = round(x / s) with the
# division in float32, rounding half to even, clamped to [-127, 127].


def fp8_pool_quantize(x: torch.Tensor, scale: float) -> torch.Tensor:
    """SGLang's fp8 pool (MHATokenToKVPool.set_kv_buffer): divide in place in x's dtype, then torch converts."""
    return x.clone().div_(scale).to(torch.float8_e4m3fn)


def quantize_int8(x: torch.Tensor, scale: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize rows x[..., D] -> (int8 [..., D], float32 scales [...])."""
    xf = x.float()
    if scale is None:
        s = xf.abs().amax(dim=-1) / 127
        s = torch.where(s > 0, s, torch.ones_like(s))
    else:
        s = torch.full(xf.shape[:-1], scale, dtype=torch.float32)
    q = torch.round(xf / s[..., None]).clamp(-127, 127).to(torch.int8)
    return q, s


def dequantize_int8(cache: torch.Tensor, scale_buf: torch.Tensor, scale: float) -> torch.Tensor:
    """An int8 cache [S, H_kv, D] as float64: times the static scale, or (NaN) the per-slot scales."""
    if math.isnan(scale):
        return cache.double() * scale_buf.double()[..., None]
    return cache.double() * torch.tensor(scale, dtype=torch.float32).double()


def write_kv_int8(
    cache: torch.Tensor, scale_buf: torch.Tensor, rows: torch.Tensor, slots: list[int], scale: float
) -> None:
    """Write new rows [N, H_kv, D] to slots of an int8 cache (in place), as the int8 operators do.

    int8 rows are copied as they are (their scales are the caller's business);
    float rows are quantized with the static scale, or dynamically with the
    scale stored at [slot, head].
    """
    for i, slot in enumerate(slots):
        if rows.dtype == torch.int8:
            cache[slot] = rows[i]
        elif math.isnan(scale):
            q, s = quantize_int8(rows[i], None)
            cache[slot] = q
            scale_buf[slot] = s
        else:
            cache[slot] = quantize_int8(rows[i], scale)[0]


def decode_split_partials(
    query: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float,
    logit_cap: float,
    splits: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """What decode must leave in attn_logits, in float64: ([B, H, splits, Dv] partial outputs, [B, H, splits] LSE).

    Split s of a sequence of length L covers tokens [s * ceil(L / splits),
    (s + 1) * ceil(L / splits)) clipped to L; its partial output is the
    softmax over those tokens only, and its LSE is log(sum exp(score)) over
    them. Empty splits are NaN in the partials and -inf in the LSE.
    """
    batch, heads, _ = query.shape
    out = torch.full((batch, heads, splits, v_buffer.shape[2]), float("nan"), dtype=torch.float64)
    lse = torch.full((batch, heads, splits), float("-inf"), dtype=torch.float64)
    for b in range(batch):
        length = int(seq_lens[b])
        slots = req_to_token[int(req_pool_indices[b]), :length].long()
        scores = _grouped_scores(query[b], k_buffer[slots], sm_scale, logit_cap)  # [H_kv, G, L]
        v = v_buffer[slots].double()
        per = -(-length // splits)
        for s in range(splits):
            lo, hi = min(s * per, length), min((s + 1) * per, length)
            if lo >= hi:
                continue
            part = scores[..., lo:hi]
            lse[b, :, s] = torch.logsumexp(part, dim=-1).reshape(heads)
            out[b, :, s] = torch.einsum("kgl,lkd->kgd", torch.softmax(part, dim=-1), v[lo:hi]).reshape(heads, -1)
    return out, lse


# ---- SGLang main's options: sliding window, sinks, encoder offset, cross attention -------------
# Written from the contract, with explicit visibility masks over decoder
# positions (the kernels instead narrow key ranges per split / per block).


def _attend(
    queries: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    visible: torch.Tensor,
    sm_scale: float,
    logit_cap: float,
    sinks: torch.Tensor | None,
) -> torch.Tensor:
    """softmax(scores masked by ``visible``, with a sink column per head that is dropped after) @ values.

    queries [H, Q, D], keys [H, K, D], values [H, K, Dv], visible [Q, K] bool.
    A query row that sees no key gives zeros (with or without a sink).
    """
    heads, rows = queries.shape[0], queries.shape[1]
    scores = _scores(queries, keys, sm_scale, logit_cap).masked_fill(~visible, float("-inf"))
    if sinks is not None:
        sink_col = sinks.double().view(heads, 1, 1).expand(heads, rows, 1)
        weights = torch.softmax(torch.cat([scores, sink_col], dim=-1), dim=-1)[..., :-1]
    else:
        weights = torch.softmax(scores, dim=-1)
    weights = torch.nan_to_num(weights, nan=0.0)  # rows with no visible key (and no sink): 0/0
    weights = weights * visible.any(dim=-1, keepdim=True)  # ... and with a sink: nothing to weigh
    return weights @ values


def decode_attention_options(
    query: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float,
    logit_cap: float,
    *,
    window: int = -1,
    sinks: torch.Tensor | None = None,
    encoder_lens: torch.Tensor | None = None,
    cross: bool = False,
) -> torch.Tensor:
    """Decode with SGLang main's options, float64 [B, H, Dv].

    Self attention: the query (position L - 1) sees decoder positions j with
    L - W <= j < L (all with W <= 0), read from column enc + j of the pool row.
    Cross attention: the encoder's enc tokens, columns 0 .. enc - 1, all seen.
    """
    batch, heads, _ = query.shape
    group = heads // k_buffer.shape[1]
    out = torch.zeros(batch, heads, v_buffer.shape[2], dtype=torch.float64)
    for b in range(batch):
        enc = int(encoder_lens[b]) if encoder_lens is not None else 0
        row = req_to_token[int(req_pool_indices[b])]
        if cross:
            slots = row[:enc].long()
            visible = torch.ones(1, enc, dtype=torch.bool)
        else:
            length = int(seq_lens[b])
            slots = row[enc : enc + length].long()
            positions = torch.arange(length)
            visible = (positions >= length - window) if window > 0 else torch.ones(length, dtype=torch.bool)
            visible = visible[None, :]
        k = k_buffer[slots].double().repeat_interleave(group, dim=1).transpose(0, 1)  # [H, K, D]
        v = v_buffer[slots].double().repeat_interleave(group, dim=1).transpose(0, 1)
        out[b] = _attend(query[b].double()[:, None, :], k, v, visible, sm_scale, logit_cap, sinks)[:, 0]
    return out


def extend_attention_options(
    q_extend: torch.Tensor,
    k_extend: torch.Tensor | None,
    v_extend: torch.Tensor | None,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    extend_seq_lens: torch.Tensor,
    extend_start_loc: torch.Tensor,
    sm_scale: float,
    logit_cap: float,
    *,
    window: int = -1,
    sinks: torch.Tensor | None = None,
    encoder_lens: torch.Tensor | None = None,
    cross: bool = False,
    causal: bool = True,
    tree_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Extend with SGLang's options, float64 [T, H, Dv] (rows no sequence owns: NaN).

    Self attention: new token i (position P + i) sees the prefix (columns
    enc .. enc + P - 1) and new tokens up to itself, positions j with
    P + i - W < j <= P + i (no lower bound with W <= 0). Cross attention: the
    encoder tokens (columns 0 .. enc - 1) only, all of them, for every row.
    ``causal`` False: every new token sees every new token. ``tree_mask``
    (SGLang 0.5.23's flat bool [B * L * L], every sequence extending by L):
    new token i of sequence b sees new token j iff tree_mask[b, i, j], and the
    prefix in full.
    """
    tokens, heads, _ = q_extend.shape
    heads_kv, head_dim_v = k_buffer.shape[1], v_buffer.shape[2]
    group = heads // heads_kv
    out = torch.full((tokens, heads, head_dim_v), float("nan"), dtype=torch.float64)
    for b in range(seq_lens.shape[0]):
        ext = int(extend_seq_lens[b])
        if ext == 0:
            continue
        prefix = int(seq_lens[b]) - ext
        start = int(extend_start_loc[b])
        enc = int(encoder_lens[b]) if encoder_lens is not None else 0
        rows = slice(start, start + ext)
        row = req_to_token[int(req_pool_indices[b])]
        if cross:
            slots = row[:enc].long()
            keys, values = k_buffer[slots], v_buffer[slots]
            visible = torch.ones(ext, enc, dtype=torch.bool)
        else:
            slots = row[enc : enc + prefix].long()
            keys = torch.cat([k_buffer[slots], k_extend[rows]])
            values = torch.cat([v_buffer[slots], v_extend[rows]])
            key_pos = torch.arange(prefix + ext)[None, :]
            query_pos = (prefix + torch.arange(ext))[:, None]
            visible = key_pos <= query_pos if causal else torch.ones(ext, prefix + ext, dtype=torch.bool)
            if tree_mask is not None:
                visible[:, prefix:] = tree_mask.view(-1, ext, ext)[b]
            if window > 0:
                visible &= key_pos > query_pos - window
        k = keys.double().repeat_interleave(group, dim=1).transpose(0, 1)
        v = values.double().repeat_interleave(group, dim=1).transpose(0, 1)
        out[rows] = _attend(
            q_extend[rows].double().transpose(0, 1), k, v, visible, sm_scale, logit_cap, sinks
        ).transpose(0, 1)
    return out


def flash_attn_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    causal: bool,
) -> torch.Tensor:
    """Dense variable-length attention in float64, [Tq, H, Dv]; rows no sequence covers are 0.

    Sequence b: queries q[cu_q[b]:cu_q[b+1]], keys/values k, v[cu_k[b]:cu_k[b+1]];
    scale 1/sqrt(D); query head h reads KV head h // (H / H_kv); causal: query i
    sees keys 0..i (top-left aligned). A query that sees no key gives 0.
    """
    heads, head_dim = q.shape[1], q.shape[2]
    group = heads // k.shape[1]
    out = torch.zeros(q.shape[0], heads, v.shape[2], dtype=torch.float64)
    for b in range(cu_seqlens_q.numel() - 1):
        q0, q1 = int(cu_seqlens_q[b]), int(cu_seqlens_q[b + 1])
        k0, k1 = int(cu_seqlens_k[b]), int(cu_seqlens_k[b + 1])
        keys = k[k0:k1].double().repeat_interleave(group, dim=1).transpose(0, 1)
        values = v[k0:k1].double().repeat_interleave(group, dim=1).transpose(0, 1)
        visible = torch.ones(q1 - q0, k1 - k0, dtype=torch.bool)
        if causal:
            visible = torch.arange(k1 - k0)[None, :] <= torch.arange(q1 - q0)[:, None]
        out[q0:q1] = _attend(
            q[q0:q1].double().transpose(0, 1), keys, values, visible, 1.0 / math.sqrt(head_dim), 0.0, None
        ).transpose(0, 1)
    return out
