"""verl: the variants it registers by name, discovered at the pin (discover.py) and called (calls_discovered.py)."""
