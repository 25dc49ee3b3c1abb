"""verl: the declaration the fuzzer reads (`declare.py`, with `declare_pipeline.py` and `declare_kinds.py`), the
calls the worker makes (`calls.py`, `calls_kinds.py`), and the variants it registers by name, discovered at the
pin (`discover.py`) and called (`calls_discovered.py`)."""
