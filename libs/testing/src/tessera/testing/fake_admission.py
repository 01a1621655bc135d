"""Admission's job reads as another service's `tessera.core.tenant_tokens` asks them, in memory: which
tokens it knows (a tenant's, or the admin's), which jobs each tenant has, and how often it was asked.

    admission = FakeAdmission(tokens={"tok-a": "team-a", "root": None}, jobs={"job-1": "team-a"})
    tokens = TenantTokens("http://admission", "required", transport=admission.transport())
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx


@dataclass
class FakeAdmission:
    #: bearer token -> its tenant; None: an admin token (admission keeps the admin's like any other)
    tokens: dict[str, str | None] = field(default_factory=dict)
    #: job id -> its tenant
    jobs: dict[str, str] = field(default_factory=dict)
    asked: int = 0

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.answer)

    def answer(self, request: httpx.Request) -> httpx.Response:
        self.asked += 1
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        if scheme != "Bearer" or token not in self.tokens:
            return httpx.Response(401, json={"code": "unauthorized"})
        caller = self.tokens[token]
        path = request.url.path
        if path == "/v1/jobs":
            tenant = request.url.params.get("tenant")
            if caller is not None and tenant is not None and tenant != caller:
                return httpx.Response(403, json={"code": "forbidden"})
            wanted = caller if caller is not None else tenant
            found = [self._job(i, t) for i, t in self.jobs.items() if wanted is None or t == wanted]
            return httpx.Response(200, json=found[: int(request.url.params.get("limit", "100"))])
        job_id = path.removeprefix("/v1/jobs/")
        owner = self.jobs.get(job_id)
        if owner is None or (caller is not None and owner != caller):
            return httpx.Response(404, json={"code": "not_found"})  # another tenant's: as if unknown
        return httpx.Response(200, json=self._job(job_id, owner))

    @staticmethod
    def _job(job_id: str, tenant: str) -> dict[str, Any]:
        return {"id": job_id, "tenant": tenant}
