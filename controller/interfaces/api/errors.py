"""How the API answers what is not a success: :class:`ApiError` and the JSON error body.

Every refusal is ``{"status", "error", **extra}`` (:func:`error_response`); a body that
pydantic refuses is 422 with one readable line per problem (:func:`validation_answer`),
non-finite numbers and lone surrogates spelled out so that the answer itself is valid
JSON. :func:`install_error_handlers` registers the three handlers on the app.

This module formats answers; it reads and changes nothing.
"""

from __future__ import annotations

import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException


class ApiError(Exception):
    """An answer other than success: status, message, and extra body fields."""

    def __init__(
        self,
        status: int,
        message: str,
        body: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.body = body or {}
        self.headers = headers or {}


def error_response(status: int, message: str, /, **extra: Any) -> JSONResponse:
    """``{"status", "error", **extra}``; ``headers`` in ``extra`` are the answer's headers.

    Positional-only, so that a body field named ``status`` or ``message`` is a field.
    """
    headers = extra.pop("headers", None)
    return JSONResponse(
        {"status": status, "error": message, **extra}, status_code=status, headers=headers
    )


def _spelled(text: str) -> str:
    """``text`` with each lone surrogate written out as ``\\udXXX`` (UTF-8 cannot carry it)."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _json_safe(value: Any) -> Any:
    """``value`` with what strict JSON in UTF-8 cannot carry spelled as text.

    Python's JSON reader accepts ``NaN``, ``Infinity`` and ``1e309`` (infinite), and a
    string escape of a lone surrogate (``"\\ud800"``), so a 422 that echoes the input
    must spell them, or the answer itself fails (a 500).
    """
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, str):
        return _spelled(value)
    if isinstance(value, dict):
        return {_spelled(str(k)): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


def _validation_lines(exc: RequestValidationError) -> list[str]:
    lines = []
    for err in exc.errors():
        if err.get("type") == "json_invalid":
            why = (err.get("ctx") or {}).get("error", "")
            lines.append(f"body: not valid JSON{f' ({why})' if why else ''}")
            continue
        loc = [str(p) for p in err.get("loc", ()) if p != "body"]
        where = ".".join(loc) or "body"
        lines.append(f"{where}: {err.get('msg', 'invalid')}")
    return lines


def validation_answer(exc: RequestValidationError) -> JSONResponse:
    """422: one readable line per problem, and pydantic's errors, made JSON-safe."""
    lines = [_spelled(line) for line in _validation_lines(exc)]
    return error_response(
        422,
        "invalid request: " + "; ".join(lines),
        problems=lines,
        detail=_json_safe(jsonable_encoder(exc.errors(), custom_encoder={Exception: str})),
    )


def install_error_handlers(app: FastAPI) -> None:
    """Every error answer of ``app`` in the one JSON shape."""

    @app.exception_handler(ApiError)
    async def api_error(_request: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status, exc.message, **exc.body, headers=exc.headers or None)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error_response(exc.status_code, str(exc.detail), headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        return validation_answer(exc)
