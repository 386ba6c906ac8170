"""The agent's RPC server (FastAPI): exactly the routes of :mod:`accelshare.protocol`.

::

    POST   /v1/kernels                  CreateKernelRequest -> KernelReport (RUNNING or FAILED;
                                        PREPARING with [container] start-in-background)
    POST   /v1/kernels/batch            [CreateKernelRequest] -> [KernelReport] (each kernel
                                        created as by POST /v1/kernels, concurrently; one
                                        report per request, in order)
    DELETE /v1/kernels/{kernel_id}      -> KernelReport (EXITED; unknown id: reason not-found)
    GET    /v1/kernels                  -> KernelList
    GET    /v1/kernels/{kernel_id}/logs -> text/plain  (?tail_bytes=N)
    POST   /v1/kernels/{kernel_id}/execute  ExecuteRequest -> ExecuteResult (a step of a
                                        run, agent/runs.py; 404 no such kernel or run,
                                        409 run conflict, 501 runtime cannot)
    DELETE /v1/kernels/{kernel_id}/execute/{run_id}  -> 204   (a run killed; 404 unknown)
    GET    /v1/alloc-map                -> AllocMapView (?form=compat -> {device: "0.80"})
    GET    /v1/stats/node               -> NodeStats
    GET    /v1/stats/kernels            -> KernelStats
    GET    /v1/health                   -> {"status": "ok", "agent_id": ...}
    PUT    /v1/kernels/{kernel_id}/files?path=REL       the file's bytes -> FileUploadResult
    GET    /v1/kernels/{kernel_id}/files?path=REL       -> application/x-tar (streamed)
    GET    /v1/kernels/{kernel_id}/files/list?path=REL  -> FileList
    WS     /v1/kernels/{kernel_id}/terminal?cols=80&rows=24   a shell in the kernel
    GET    /metrics                     -> Prometheus text (open)

Every ``/v1`` route needs ``X-Accelshare-Cluster-Secret``, compared in constant time;
without it or with a wrong one the answer is ``401 application/problem+json``.  A kernel
that cannot be created is not an HTTP error: the report says FAILED with the reason
(``UnsupportedResource: ...``, ``InsufficientResource: ...``) so that the manager can
record it on the session; a manager's plan that no longer fits is a FAILED report with
``conflict: true`` (``PlanConflict: ...``), which the manager answers by planning again.  Malformed bodies are ``400`` problems; a runtime that fails
while destroying or reading logs gives a ``500`` problem (``kernel-runtime-error``).
A body over ``[agent] rpc-max-body-bytes`` (default 4 MiB) is a ``413`` problem naming
the limit and the size received, before the secret is checked and before it is read
whole (:mod:`accelshare.body_limit`); a file upload (``PUT .../files``) streams
instead, under ``[container] file-upload-max-bytes`` (413 naming it, nothing kept).
The files routes (:mod:`.kernel_files`, :mod:`accelshare.protocol.files`): 400 a
refused path, 404 no running kernel or no such file, 409 a folder where a file is
expected, a symlink on the way, or a read-only mount.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hmac
import logging
from collections.abc import Iterator
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, FastAPI, Query, Request, WebSocket
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from pydantic import ValidationError

from accelshare.body_limit import BodySizeLimit, BodyTooLarge
from accelshare.body_limit import problem_response as body_problem_response
from accelshare.protocol import (
    CLUSTER_SECRET_HEADER,
    CreateKernelBatch,
    CreateKernelRequest,
    ExecuteRequest,
    KernelReport,
    KernelReports,
    KernelStatus,
)
from accelshare.protocol.files import check_relative_path

from .kernel_files import (
    FileConflict,
    FileMissing,
    KernelFolder,
    UploadTooLarge,
    list_folder,
    put_file,
    tar_stream,
)
from .metrics import CONTENT_TYPE
from .runs import ExecUnsupported, RunConflict, RunNotFound
from .runtime import KernelNotFound, KernelRuntimeError
from .service import AgentService
from .terminal_ws import relay_terminal

__all__ = ["PROBLEM_MEDIA_TYPE", "RpcProblem", "create_rpc_app"]

log = logging.getLogger(__name__)

PROBLEM_MEDIA_TYPE = "application/problem+json"


class RpcProblem(Exception):
    def __init__(self, status: int, slug: str, title: str, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.slug = slug
        self.title = title
        self.detail = detail

    def response(self) -> JSONResponse:
        body = {
            "type": f"/problems/{self.slug}",
            "title": self.title,
            "status": self.status,
            "detail": self.detail,
        }
        headers = {"WWW-Authenticate": "ClusterSecret"} if self.status == 401 else None
        return JSONResponse(
            body, status_code=self.status, media_type=PROBLEM_MEDIA_TYPE, headers=headers
        )


def _secret_checker(secret: str | None) -> Any:
    expected = secret.encode() if secret is not None else None

    # async (it never blocks): FastAPI would run a plain function in its thread pool, a
    # thread hop on every RPC call that showed in the alloc-map query's latency under load.
    async def check(request: Request) -> None:
        if expected is None:  # dev mode on loopback (see accelshare.agent.secret)
            return
        given = request.headers.get(CLUSTER_SECRET_HEADER)
        if given is None:
            raise RpcProblem(
                401, "unauthorized", "Unauthorized", f"missing {CLUSTER_SECRET_HEADER} header"
            )
        if not hmac.compare_digest(given.encode(), expected):
            raise RpcProblem(401, "unauthorized", "Unauthorized", "wrong cluster secret")

    return check


def _failed(request: CreateKernelRequest, reason: str) -> KernelReport:
    return KernelReport(
        kernel_id=request.kernel_id,
        session_id=request.session_id,
        status=KernelStatus.FAILED,
        image=request.image,
        reason=reason,
    )


def _json(model: Any) -> Response:
    return Response(model.model_dump_json(), media_type="application/json")


def _too_large_problem(exc: BodyTooLarge, path: str) -> dict[str, Any]:
    return {
        "type": "/problems/content-too-large",
        "title": "Content Too Large",
        "status": 413,
        "detail": exc.detail,
        "instance": path,
        "limit_bytes": exc.limit_bytes,
        "received_bytes": exc.received_bytes,
    }


def _is_file_upload(scope: Any) -> bool:
    return bool(scope.get("method") == "PUT" and str(scope.get("path", "")).endswith("/files"))


@contextlib.contextmanager
def _file_problems(rel: str) -> Iterator[None]:
    """The file routes' errors as problems (404, 409; an OS error naming the path)."""
    try:
        yield
    except FileMissing as e:
        raise RpcProblem(404, "file-not-found", "Not found", str(e)) from None
    except FileConflict as e:
        raise RpcProblem(409, "file-conflict", "Conflict", str(e)) from None
    except (NotADirectoryError, IsADirectoryError) as e:
        raise RpcProblem(409, "file-conflict", "Conflict", f"{rel!r}: {e.strerror}") from None
    except FileNotFoundError as e:
        raise RpcProblem(404, "file-not-found", "Not found", f"{rel!r}: {e.strerror}") from None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise RpcProblem(
                409, "file-conflict", "Conflict", f"{rel!r} is a symlink: not followed"
            ) from None
        if e.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
            raise RpcProblem(409, "file-conflict", "Conflict", f"{rel!r}: {e.strerror}") from None
        raise


def create_rpc_app(
    service: AgentService, *, secret: str | None, max_body_bytes: int | None = None
) -> FastAPI:
    """``max_body_bytes``: None = the agent's ``[agent] rpc-max-body-bytes``."""
    app = FastAPI(
        title=f"accelshare agent {service.agent_id}",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )

    @app.exception_handler(RpcProblem)
    async def _problem(_: Request, exc: RpcProblem) -> Response:
        return exc.response()

    @app.exception_handler(BodyTooLarge)
    async def _too_large(request: Request, exc: BodyTooLarge) -> Response:
        return body_problem_response(exc, request.url.path, _too_large_problem)

    if max_body_bytes is None:
        max_body_bytes = service.config.agent.rpc_max_body_bytes
    app.add_middleware(
        BodySizeLimit,
        max_bytes=max_body_bytes,
        problem=_too_large_problem,
        exempt=_is_file_upload,
    )

    @app.exception_handler(KernelRuntimeError)
    async def _runtime_error(_: Request, exc: KernelRuntimeError) -> Response:
        log.error("runtime error: %s", exc)
        return RpcProblem(500, "kernel-runtime-error", "Kernel runtime error", str(exc)).response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> Response:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(part) for part in first.get("loc", ()))
        detail = f"{where}: {first.get('msg', 'invalid request')}"
        return RpcProblem(400, "invalid-api-params", "Invalid API parameters", detail).response()

    router = APIRouter(prefix="/v1", dependencies=[Depends(_secret_checker(secret))])
    expected = secret.encode() if secret is not None else None

    @router.post("/kernels")
    async def create_kernel(body: CreateKernelRequest) -> Response:
        return _json(await service.create_kernel(body))

    @router.post("/kernels/batch")
    async def create_kernels(request: Request) -> Response:
        try:
            bodies = CreateKernelBatch.validate_json(await request.body())
        except ValidationError as e:
            errors = e.errors()
            where = ".".join(str(part) for part in errors[0]["loc"]) if errors else ""
            detail = f"{where}: {errors[0]['msg'] if errors else 'invalid request'}"
            raise RpcProblem(400, "invalid-api-params", "Invalid API parameters", detail) from e
        # Started in order (each allocates before its first wait: requests without a
        # plan are placed in the order sent), then awaited together.
        # A runtime error fails its own kernel (as its single create's 500 would), not
        # the batch.
        results = await asyncio.gather(
            *(service.create_kernel(body) for body in bodies), return_exceptions=True
        )
        reports: list[KernelReport] = []
        for body, result in zip(bodies, results, strict=True):
            if isinstance(result, KernelReport):
                reports.append(result)
            elif isinstance(result, KernelRuntimeError):
                log.error("runtime error: %s", result)
                reports.append(_failed(body, f"kernel runtime error: {result}"))
            else:
                raise result
        return Response(KernelReports.dump_json(reports), media_type="application/json")

    @router.delete("/kernels/{kernel_id}")
    async def destroy_kernel(kernel_id: str) -> Response:
        return _json(await service.destroy_kernel(kernel_id))

    @router.get("/kernels")
    async def list_kernels() -> Response:
        return _json(service.list_kernels())

    @router.get("/kernels/{kernel_id}/logs")
    async def kernel_logs(
        kernel_id: str, tail_bytes: Annotated[int | None, Query(ge=0)] = None
    ) -> Response:
        try:
            text = await service.kernel_logs(kernel_id, tail_bytes=tail_bytes)
        except KernelNotFound:
            raise RpcProblem(
                404, "not-found", "Not found", f"kernel {kernel_id} not found"
            ) from None
        return PlainTextResponse(text)

    @router.post("/kernels/{kernel_id}/execute")
    async def execute(kernel_id: str, body: ExecuteRequest) -> Response:
        try:
            return _json(await service.execute(kernel_id, body))
        except KernelNotFound:
            raise RpcProblem(
                404, "not-found", "Not found", f"kernel {kernel_id} is not running"
            ) from None
        except RunNotFound as e:
            raise RpcProblem(404, "run-not-found", "Not found", str(e)) from None
        except RunConflict as e:
            raise RpcProblem(409, "run-conflict", "Conflict", str(e)) from None
        except ExecUnsupported as e:
            raise RpcProblem(501, "not-implemented", "Not implemented", str(e)) from None

    @router.delete("/kernels/{kernel_id}/execute/{run_id}", status_code=204)
    async def cancel_run(kernel_id: str, run_id: str) -> Response:
        try:
            await service.cancel_run(kernel_id, run_id)
        except RunNotFound as e:
            raise RpcProblem(404, "run-not-found", "Not found", str(e)) from None
        return Response(status_code=204)

    async def folder_of(kernel_id: str, path: str) -> tuple[KernelFolder, str]:
        try:
            rel = check_relative_path(path)
        except ValueError as e:
            raise RpcProblem(400, "invalid-api-params", "Invalid API parameters", str(e)) from None
        try:
            return await service.kernel_folder(kernel_id), rel
        except KernelNotFound:
            raise RpcProblem(
                404, "not-found", "Not found", f"kernel {kernel_id} is not running"
            ) from None

    @router.put("/kernels/{kernel_id}/files")
    async def put_kernel_file(kernel_id: str, path: str, request: Request) -> Response:
        folder, rel = await folder_of(kernel_id, path)
        limit = service.config.container.file_upload_max_bytes
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise RpcProblem(
                413,
                "content-too-large",
                "Content Too Large",
                str(UploadTooLarge(limit, int(declared))),
            )
        try:
            with _file_problems(rel):
                result = await put_file(folder, rel, request.stream(), limit_bytes=limit)
        except UploadTooLarge as e:
            raise RpcProblem(413, "content-too-large", "Content Too Large", str(e)) from None
        return _json(result)

    @router.get("/kernels/{kernel_id}/files")
    async def get_kernel_files(kernel_id: str, path: str = "") -> Response:
        folder, rel = await folder_of(kernel_id, path)
        with _file_problems(rel):
            stream = await tar_stream(folder, rel)
        return StreamingResponse(stream, media_type="application/x-tar")

    @router.get("/kernels/{kernel_id}/files/list")
    async def list_kernel_files(kernel_id: str, path: str = "") -> Response:
        folder, rel = await folder_of(kernel_id, path)
        with _file_problems(rel):
            listing = await asyncio.to_thread(list_folder, folder, rel)
        return _json(listing)

    @router.get("/alloc-map")
    async def alloc_map(form: Literal["full", "compat"] = "full") -> Response:
        if form == "compat":
            return JSONResponse(service.compat_alloc_map())
        return Response(service.alloc_map_json(), media_type="application/json")

    @router.get("/stats/node")
    async def node_stats() -> Response:
        return _json(await service.node_stats())

    @router.get("/stats/kernels")
    async def kernel_stats() -> Response:
        return _json(await service.kernel_stats())

    @router.get("/health")
    async def health() -> Response:
        return JSONResponse(service.health())

    app.include_router(router)

    @app.websocket("/v1/kernels/{kernel_id}/terminal")
    async def kernel_terminal(websocket: WebSocket, kernel_id: str) -> None:
        # Route dependencies taking a Request do not run for WebSockets: check here.
        if expected is not None:
            given = websocket.headers.get(CLUSTER_SECRET_HEADER, "")
            if not hmac.compare_digest(given.encode(), expected):
                await websocket.accept()
                await websocket.close(code=4401, reason="missing or wrong cluster secret")
                return
        await relay_terminal(
            websocket,
            service.runtime,
            kernel_id,
            kernel_ended=lambda: service.kernel_ended(kernel_id),
        )

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(service.metrics.render(), media_type=CONTENT_TYPE)

    return app
