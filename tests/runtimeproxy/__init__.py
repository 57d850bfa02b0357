"""Tests of fgpu-runtime-proxy: its pure core, its framing, and end to end against a real containerd."""
