"""The local stack behind hack/local-up.sh: start fgpu on one fake GPU node and run the demo pods."""
