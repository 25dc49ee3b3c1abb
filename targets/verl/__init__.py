"""verl: the declaration the fuzzer reads (`declare.py`, with `declare_pipeline.py` and `declare_kinds.py`) and
the calls the worker makes (`calls.py`, `calls_kinds.py`)."""
