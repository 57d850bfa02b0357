"""fgpuctl: the operator CLI. A front end: it may use any component's public API."""
