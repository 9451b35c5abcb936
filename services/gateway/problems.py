"""RFC 9457 problem documents: every error the gateway answers, with a machine-readable type."""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse

PROBLEM = "application/problem+json"


class Problem(Exception):
    """An RFC 9457 problem: answered as application/problem+json with a machine-readable type."""

    def __init__(self, status: int, kind: str, title: str, detail: str = "", **extra: Any) -> None:
        self.status, self.kind, self.title, self.detail, self.extra = status, kind, title, detail, extra


def problem_response(problem: Problem, headers: dict[str, str] | None = None) -> JSONResponse:
    body = {"type": f"urn:signoff:problem:{problem.kind}", "title": problem.title, "status": problem.status}
    if problem.detail:
        body["detail"] = problem.detail
    body.update(problem.extra)
    # Also here, not only in `answers.EveryAnswer`: a 500 is answered outside every middleware.
    headers = {"X-Content-Type-Options": "nosniff", "Cache-Control": "no-store", **(headers or {})}
    return JSONResponse(body, status_code=problem.status, media_type=PROBLEM, headers=headers)
