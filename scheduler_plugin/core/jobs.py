"""Same GPU model for every pod of a job.

The first pod of a job that gets GPUs fixes the job's model; later pods of the
job are only placed on GPUs of that model. The model is remembered while any
pod of the job is counted (bound or assumed) and forgotten with its last pod,
so a job that is deleted and recreated chooses afresh.
"""

from __future__ import annotations

from scheduler_plugin.core.api import PodUID


class JobModels:
    def __init__(self) -> None:
        self._model: dict[str, str] = {}
        self._members: dict[str, set[PodUID]] = {}

    def model_of(self, job_key: str) -> str | None:
        return self._model.get(job_key) if job_key else None

    def join(self, job_key: str, uid: PodUID, model: str | None) -> None:
        """Counts `uid` in the job; `model` (the model it got, if any) fixes the job's model when unset."""
        if not job_key:
            return
        self._members.setdefault(job_key, set()).add(uid)
        if model and job_key not in self._model:
            self._model[job_key] = model

    def leave(self, job_key: str, uid: PodUID) -> None:
        members = self._members.get(job_key)
        if members is None:
            return
        members.discard(uid)
        if not members:
            del self._members[job_key]
            self._model.pop(job_key, None)

    def jobs(self) -> dict[str, str]:
        """Job key -> model, for views and tests."""
        return dict(self._model)
