"""The pieces of ``benchmarks/throughput.py``: timing (``timing``), the shared backbone (``models``), the packed and
unpacked variants (``alea_variants``) and stock TRL (``trl_variant``)."""
