"""Benchmarks of memory-archive: speed, footprint, memory and retrieval quality, each against a baseline
measured in the same run. Run `python -m bench --help`."""
