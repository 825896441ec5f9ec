"""The demo's serving path in plain PyTorch: the model, the KV pools, the forward batch, the attention backends
and the generation engine. Nothing here imports SGLang; :mod:`rvv_attn.sglang_plugin` builds on it, not the
other way round."""
