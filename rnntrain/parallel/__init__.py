"""Stage 3, parallel: the distributed layer (the only code that touches MPI) and the
gradient exchange built on it."""
