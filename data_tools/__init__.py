"""rnntrain-data: preprocessing tools (synth, inspect, convert, shard, audio)."""
