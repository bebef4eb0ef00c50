"""The pieces of ``benchmarks/throughput.py``: timing (``timing``), the shared backbone and shapes (``models``), the
trainer and unpacked variants (``alea_variants``), fair and stock TRL (``trl_variant``), token and FLOP arithmetic
(``flops``), the machine's load (``machine``) and the summaries (``report``)."""
