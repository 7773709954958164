"""rnntrain's benchmark suite.

Each section is a module ``bench/<name>.py`` with ``run(quick: bool = False) -> str`` that
measures side by side in one process run and returns a markdown section (with the
command that reproduces it). ``python -m bench`` runs every section and regenerates
docs/benchmarks.md; ``python -m bench NAME [--quick]`` runs one.
"""
