"""Independent reference implementations in plain torch (float64 math).

Nothing here calls the kernels; tests compare the kernels against these.
"""

from __future__ import annotations

import torch


def write_kv(k_buffer: torch.Tensor, v_buffer: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
             loc: torch.Tensor) -> None:
    """What decode_set_kv_buffer must do, by plain indexing."""
    for b, slot in enumerate(loc.tolist()):
        k_buffer[slot] = key[b]
        v_buffer[slot] = value[b]


def decode_attention(query: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor,
                     req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
                     sm_scale: float, logit_cap: float) -> torch.Tensor:
    """Decode attention in float64, one sequence at a time, over the whole score row.

    Sequence b's query heads attend over cache slots
    req_to_token[req_pool_indices[b], :seq_lens[b]]; query head h reads KV
    head h // (H / H_kv). Returns [B, H, Dv] float64.
    """
    batch, heads, _ = query.shape
    group = heads // k_buffer.shape[1]
    out = torch.empty(batch, heads, v_buffer.shape[2], dtype=torch.float64)
    for b in range(batch):
        length = int(seq_lens[b])
        slots = req_to_token[int(req_pool_indices[b]), :length].long()
        k = k_buffer[slots].double().repeat_interleave(group, dim=1)  # [L, H, D]
        v = v_buffer[slots].double().repeat_interleave(group, dim=1)  # [L, H, Dv]
        scores = torch.einsum("hd,lhd->hl", query[b].double(), k) * sm_scale
        if logit_cap > 0:
            scores = logit_cap * torch.tanh(scores / logit_cap)
        out[b] = torch.einsum("hl,lhd->hd", torch.softmax(scores, dim=-1), v)
    return out
