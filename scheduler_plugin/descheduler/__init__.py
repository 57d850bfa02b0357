"""fgpu-descheduler: moves opted-in, recreatable pods so a pending GPU pod fits (docs/defrag.md)."""
