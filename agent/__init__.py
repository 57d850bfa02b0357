"""fgpu node agent: NVML discovery, health, usage, Device reporting and the GPU runtime hook."""
