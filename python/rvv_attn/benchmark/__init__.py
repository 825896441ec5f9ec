"""Time the operators by wall clock on this machine: ``python -m rvv_attn.benchmark``.

The board benchmark. It runs the shapes real models use (Llama-3-8B-like and
Qwen2.5-7B-like GQA decode, DeepSeek-V2-Lite-like MLA decode, extend chunks
with and without a cached prefix, a sliding-window layer, int8 caches beside
bf16) at each torch thread count from 1 up to the CPU count, times torch's
own scaled_dot_product_attention over the same gathered K/V beside each row,
and measures the machine's copy bandwidth in the same run. It prints a table
and, with ``--json PATH``, writes every figure with the environment it was
measured in (docs/board.md says what each column means).

Modules: ``shapes`` (what is measured and the work and bytes of each shape),
``calls`` (the operator and SDPA calls for a shape), ``timing`` (clocks,
spreads, the bandwidth probe), ``machine`` (CPU, clock, threads, emulation),
``report`` (rows, the table, the JSON document, the cycle-model comparison),
``cli`` (the command line).
"""
