"""Every failure as an OpenAI-style error response: which status, which body.

    400  the caller's fault: malformed JSON, wrong field types, an unknown model, n != 1,
         anything specrt rejects (SpecrtError: prompt too long for the cache, bad K, ...)
    503  the bounded queue is full (QueueFullError), with Retry-After; or the server is
         shutting down (ClosedError: the LLM closed after --shutdown-timeout)
    500  anything else, for that request alone; the server lives on

The body is always {"error": {"message", "type", "param", "code"}}.
"""
from __future__ import annotations

import logging
from typing import Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from specrt.errors import ClosedError, QueueFullError, SpecrtError
from specrt.serve.schemas import FIELD_FORMS

log = logging.getLogger("specrt.serve")
RETRY_AFTER_S = 1


def _unreadable(cause: BaseException | None) -> str:
    """Why a body that is not malformed JSON could not be parsed (FastAPI chains the cause)."""
    if isinstance(cause, UnicodeDecodeError):
        return "not UTF-8"
    if isinstance(cause, RecursionError):
        return "JSON nested too deeply"
    if isinstance(cause, ValueError) and "digits" in str(cause):
        return "a number with more digits than any field takes"
    return "not UTF-8 JSON"


class APIError(Exception):
    """A request the server refuses, with its status and OpenAI error type."""

    def __init__(self, message: str, status: int = 400, type_: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message, self.status, self.type, self.param, self.code = \
            message, status, type_, param, code


def error_body(message: str, type_: str, param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def as_api_error(exc: BaseException) -> APIError:
    """The APIError a request failing with `exc` answers with."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, QueueFullError):
        return APIError(str(exc), 503, "service_unavailable", code="queue_full")
    if isinstance(exc, ClosedError):              # the server is shutting down
        return APIError("the server is shutting down", 503, "service_unavailable",
                        code="shutting_down")
    if isinstance(exc, SpecrtError):
        return APIError(str(exc), 400)
    log.error("request failed", exc_info=exc)
    return APIError(f"internal error: {type(exc).__name__}: {exc}", 500, "internal_error")


def error_response(err: APIError) -> JSONResponse:
    headers = {"Retry-After": str(RETRY_AFTER_S)} if err.status == 503 else None
    return JSONResponse(error_body(err.message, err.type, err.param, err.code),
                        status_code=err.status, headers=headers)


SEND_JSON = "send a UTF-8 JSON object with Content-Type: application/json"


def install_handlers(app: FastAPI, failed: Callable[[int], None]) -> None:
    """Answer what FastAPI and Starlette raise before a route runs (a body that is not JSON,
    a field of the wrong type, an unknown path) as the routes answer: an OpenAI error body,
    counted by failed(status)."""
    def answer(err: APIError) -> JSONResponse:
        failed(err.status)
        return error_response(err)

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        return answer(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        msg, param = _validation_message(exc.errors())
        content_type = request.headers.get("content-type", "")
        if "json" not in content_type.lower():     # curl -d sends a form's type
            came = f"the body came as {content_type or 'no Content-Type'}"
            msg += f" ({came})" if msg.endswith(SEND_JSON) else f" ({came}; {SEND_JSON})"
        return answer(APIError(msg, 400, param=param))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        message = str(exc.detail)
        if exc.status_code == 400 and message == "There was an error parsing the body":
            message = f"the request body could not be read ({_unreadable(exc.__cause__)}); " \
                      + SEND_JSON
        type_ = "invalid_request_error" if exc.status_code < 500 else "internal_error"
        failed(exc.status_code)
        return JSONResponse(error_body(message, type_), status_code=exc.status_code,
                            headers=exc.headers)

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception):
        return answer(as_api_error(exc))


def _validation_message(errors: list[dict]) -> tuple[str, str | None]:
    """(one message, the field to name as `param`) for what pydantic found wrong in a body:
    a body that is not JSON says where; a field of several shapes (schemas.FIELD_FORMS) that
    fits none says what it takes, once, instead of each shape pydantic tried; others (a
    missing field too) say pydantic's words."""
    first = errors[0] if errors else {}
    if first and not [p for p in first.get("loc", ()) if p != "body"]:   # the body as a whole
        raw = first.get("input")
        got = "an empty body" if first.get("type") == "missing" else \
            "a body it did not read as JSON" if isinstance(raw, (bytes, bytearray)) else \
            _json_kind(raw)
        return f"the request body must be a JSON object of the request's fields, got {got}; " \
            + SEND_JSON, None
    if first.get("type") == "json_invalid":
        where = [p for p in first.get("loc", ()) if isinstance(p, int)]
        at = f" at character {where[0]}" if where else ""
        return (f"the request body is not valid JSON{at}: "
                f"{first.get('ctx', {}).get('error', '')}", None)
    parts, said, param = [], set(), None
    for e in errors[:5]:
        loc = [str(p) for p in e.get("loc", ()) if p != "body"]
        form = _form_of(loc, missing=e.get("type") == "missing")
        if form is not None:
            name, takes = form
            part = f"{name} must be {takes}"
        else:
            name, part = ".".join(loc) or None, f"{'.'.join(loc) or 'body'}: {e['msg']}"
        if part not in said:
            said.add(part)
            parts.append(part)
        param = param or name
    return "; ".join(parts), param


def _json_kind(value) -> str:
    """What JSON value `value` (as parsed) is, in JSON's words."""
    if value is None:
        return "JSON null"
    if isinstance(value, bool):
        return "a JSON boolean"
    if isinstance(value, (int, float)):
        return "a JSON number"
    return {str: "a JSON string", list: "a JSON array", dict: "a JSON object"}.get(
        type(value), "a JSON value")


def _form_of(loc: list[str], missing: bool) -> tuple[str, str] | None:
    """(the field of FIELD_FORMS that an error at `loc` is in, what it takes) or None.
    pydantic's path names each union shape it tried (messages.0.content.list[TextPart].0.type);
    FIELD_FORMS names any index N (messages.N.content). A field that is itself missing is
    said as pydantic says it."""
    for n in range(len(loc), 0, -1):
        takes = FIELD_FORMS.get(".".join("N" if p.isdigit() else p for p in loc[:n]))
        if takes is not None:
            return None if missing and n == len(loc) else (".".join(loc[:n]), takes)
    return None
