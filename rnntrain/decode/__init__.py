"""Decoding CTC outputs and scoring hypotheses (RNNLIB's error figures)."""
