"""Source templates of the files `maskfuzz repro` writes (read as text by `fuzz.repro`, never run by maskfuzz)."""
