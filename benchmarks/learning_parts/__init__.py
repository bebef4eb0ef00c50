"""The pieces of ``benchmarks/learning.py``: the env set, evaluation episodes and reference policies
(``references``), and the table, curves PNG and JSON line (``report``)."""
