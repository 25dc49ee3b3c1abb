"""Source templates of the files `maskfuzz repro` writes (read as text by `fuzz.repro_assembly`; maskfuzz never
runs them)."""
