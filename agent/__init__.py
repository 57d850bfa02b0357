"""fgpu node agent: NVML discovery, health, usage, Device reporting and the GPU runtime hook.

Words, as the runtime proxy uses them (runtimeproxy/__init__.py): the agent's hook *rejects* a
container it will not give GPUs (`HookDecision.rejection`, `HookResponse.rejection`, "rejected" in
`fgpu_agent_hook_decisions_total`); the proxy then *refuses* the CRI call, answering kubelet itself.
"""
