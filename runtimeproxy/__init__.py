"""fgpu runtime proxy: a CRI gRPC proxy between kubelet and containerd that applies GPU hooks."""
