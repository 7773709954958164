"""Tools over finished or running runs: listing, sweeps, reports."""
