"""A private containerd for tests and benchmarks, with local images built from busybox-static."""
