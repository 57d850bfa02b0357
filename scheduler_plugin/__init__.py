"""fgpu scheduler plugin service: node and GPU choice, signed allocations, kube-scheduler integration."""
