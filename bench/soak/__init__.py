"""The chaos soak (issue 15): every daemon under churn and faults, invariants checked from outside.

Modules: `adapter` (the only coupling to fgpu's in-flux internals), `stack`
(containerd, API double, agents, proxies, two schedulers), `kubeclient`,
`kubelet` (one driver per node), `workload`, `faults`, `invariants`,
`runner` (the phases), `report`. Entry point: bench/soak.py.
"""
