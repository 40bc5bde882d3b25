"""Interleaved comparisons: `ccbench compare`, `gate` and `osu-check`, and what they share."""
