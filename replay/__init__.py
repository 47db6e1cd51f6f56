"""Replay: dataset generation and the replay engine (see the replay issue; not built yet)."""
