"""slime: the declaration the fuzzer reads (`declare.py`) and the calls the worker makes (`calls.py`,
`calls_kinds.py`)."""
