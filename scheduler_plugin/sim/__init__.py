"""Trace-driven simulator: replays production GPU traces through the scheduler core."""
