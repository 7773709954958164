"""Stage 1, data: RNNLIB NetCDF files, dataset metadata, epoch plans, the chunk reader.

Nothing here imports torch: planning works from lengths alone, payload is read later on
the reader thread.
"""
