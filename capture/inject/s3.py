"""S3 object-read hooks injected into a captured job: one ``S3``/``GetObject`` event per object
read through boto3/botocore.

A hook family of :mod:`capture.inject.hooks` (see its ``EXTENSIONS``): in the job this file is
the top-level module ``_dlreplay_s3``, in dlreplay's own process ``dlreplay.capture.inject.s3``.
Self-contained like the core: imports nothing of dlreplay but the core hooks module.

DFTracer names no object-storage events (its preload traces ``POSIX`` and ``STDIO`` calls, its
AI conventions name no storage client), so these are named like DFTracer's own I/O records: the
category is the interface (``S3``, upper case as ``POSIX``) and the name the call (the S3
operation, ``GetObject``), with DFTracer's timestamps (microseconds) and these args:

==============  =================================================================
arg             meaning
==============  =================================================================
``url``         ``s3://<bucket>/<key>`` (not ``path``: no file of the job's)
``bucket``      the bucket
``key``         the object's key
``offset``      first byte asked for (``Range: bytes=<offset>-...``; 0 without a
                ``Range``; absent for a suffix range ``bytes=-n``)
``length``      bytes asked for (a closed range's length, a suffix range's n;
                absent for a whole-object GET or an open range ``bytes=a-``)
``bytes``       bytes the server answered with (``ContentLength``)
``object_size`` the object's size (``ContentRange``'s total, else ``ContentLength``
                of a whole-object GET)
``client``      ``boto3``, ``s3torchconnector``, ``s3fs`` (aiobotocore's client where
                s3fs is loaded) or ``aiobotocore``
``error``       1 when the call raised (the job's exception is raised unchanged)
==============  =================================================================

The event spans botocore's API call: the request, up to the response's headers (``latency``).
The body streams afterwards when the job reads ``Body``: that time falls in the job's own
events around the call (``data/item``), never in this one. No credential, endpoint or request
header is recorded.

Where: ``botocore.client.BaseClient._make_api_call``, through which every boto3/botocore client
call passes (``client.get_object``, ``Object.get``, ``download_fileobj``'s ranged GETs). The
wrapper calls the original exactly once with the job's arguments and returns its result or
raises its exception; bookkeeping that fails is a miss (``capture`` reports misses).
s3torchconnector (its own native client): at ``S3Client._get_object_stream`` (below).
s3fs/fsspec: at ``aiobotocore.client.AioBaseClient._make_api_call``, the async twin of botocore's
(every ``get_object`` of s3fs: ``cat_file``, ``open(...).read``'s ranged fetches), awaited in
fsspec's I/O thread; the event spans the awaited call (the request, up to the response's
headers) as for boto3.
"""

from __future__ import annotations

import functools
import re
import sys
from collections.abc import Callable
from typing import Any

try:  # dlreplay's own process: the package capture.inject
    from . import hooks as core
except ImportError:  # in the job: top-level modules beside each other
    import _dlreplay_hooks as core  # type: ignore[no-redef]

CATEGORY = "S3"
GET = "GetObject"
HOOK = "boto3.GetObject"

_RANGE = re.compile(r"^\s*bytes\s*=\s*(\d*)\s*-\s*(\d*)\s*$")
_CONTENT_RANGE = re.compile(r"^\s*bytes\s+(\d+)-(\d+)/(\d+|\*)\s*$")


def parse_range(text: Any) -> tuple[int | None, int | None]:
    """(offset, length) in bytes of an HTTP ``Range`` header (one range); (0, None) without one.
    ``bytes=a-b``: (a, b-a+1); ``bytes=a-``: (a, None); ``bytes=-n``: (None, n)."""
    if not text:
        return 0, None
    m = _RANGE.match(str(text))
    if m is None or not (m.group(1) or m.group(2)):
        return None, None
    first, last = m.group(1), m.group(2)
    if not first:
        return None, int(last)
    if not last:
        return int(first), None
    return int(first), int(last) - int(first) + 1


def object_size(response: Any, ranged: bool) -> int | None:
    """The object's size in bytes from a GetObject response's ``ContentRange`` total, else
    (a whole-object GET) its ``ContentLength``."""
    m = _CONTENT_RANGE.match(str(response.get("ContentRange") or ""))
    if m is not None and m.group(3) != "*":
        return int(m.group(3))
    if not ranged and response.get("ContentLength") is not None:
        return int(response["ContentLength"])
    return None


def _begin(params: Any, client: str = "boto3") -> tuple[int | None, dict[str, Any]]:
    bucket, key = params.get("Bucket"), params.get("Key")
    offset, length = parse_range(params.get("Range"))
    args = {
        "url": f"s3://{bucket}/{key}",
        "bucket": bucket,
        "key": key,
        "offset": offset,
        "length": length,
        "client": client,
    }
    return core.REGIONS.begin(GET, CATEGORY), args


def _end(opened: tuple[int | None, dict[str, Any]] | None, response: Any) -> None:
    if opened is None:  # begin missed, and was counted
        return
    handle, args = opened
    if response is None:  # the job's call raised
        core.REGIONS.end(handle, error=1, **args)
        return
    nbytes = response.get("ContentLength")
    size = object_size(response, bool(response.get("ContentRange")))
    if nbytes is None:
        core.MISSES.add(HOOK, "no ContentLength")
    core.REGIONS.end(handle, bytes=nbytes, object_size=size, **args)


def wrap_make_api_call(orig: Callable[..., Any]) -> Callable[..., Any]:
    """botocore's ``_make_api_call(self, operation_name, api_params)`` with GetObject traced."""

    @functools.wraps(orig)
    def wrapper(self: Any, operation_name: Any, api_params: Any, *rest: Any, **kw: Any) -> Any:
        if operation_name != GET:
            return orig(self, operation_name, api_params, *rest, **kw)
        opened = core.guard(HOOK, _begin, api_params)
        try:
            result = orig(self, operation_name, api_params, *rest, **kw)
        except BaseException:
            core.guard(HOOK, _end, opened, None)
            raise
        core.guard(HOOK, _end, opened, result)
        return result

    wrapper._dlreplay_wrapped = True  # type: ignore[attr-defined]
    return wrapper


HOOK_AIO = "aiobotocore.GetObject"


def _aio_client() -> str:
    """The library behind an aiobotocore GET: s3fs where it is loaded, else aiobotocore."""
    return "s3fs" if "s3fs" in sys.modules else "aiobotocore"


def wrap_aio_make_api_call(orig: Callable[..., Any]) -> Callable[..., Any]:
    """aiobotocore's ``async _make_api_call(self, operation_name, api_params)`` (s3fs's client)
    with GetObject traced: the wrapper awaits the original once and returns its result."""

    @functools.wraps(orig)
    async def wrapper(
        self: Any, operation_name: Any, api_params: Any, *rest: Any, **kw: Any
    ) -> Any:
        if operation_name != GET:
            return await orig(self, operation_name, api_params, *rest, **kw)
        opened = core.guard(HOOK_AIO, _begin, api_params, _aio_client())
        try:
            result = await orig(self, operation_name, api_params, *rest, **kw)
        except BaseException:
            core.guard(HOOK_AIO, _end, opened, None)
            raise
        core.guard(HOOK_AIO, _end, opened, result)
        return result

    wrapper._dlreplay_wrapped = True  # type: ignore[attr-defined]
    return wrapper


def _patch_aiobotocore(mod: Any) -> None:
    cls = getattr(mod, "AioBaseClient", None)
    orig = getattr(cls, "_make_api_call", None) if cls is not None else None
    if orig is None or getattr(orig, "_dlreplay_wrapped", False):
        return
    cls._make_api_call = wrap_aio_make_api_call(orig)  # type: ignore[union-attr]


def _patch_botocore(mod: Any) -> None:
    cls = getattr(mod, "BaseClient", None)
    orig = getattr(cls, "_make_api_call", None) if cls is not None else None
    if orig is None or getattr(orig, "_dlreplay_wrapped", False):
        return
    cls._make_api_call = wrap_make_api_call(orig)  # type: ignore[union-attr]


HOOK_TC = "s3torchconnector.GetObject"


class CountedStream:
    """s3torchconnector's ``GetObjectStream`` (an iterator of byte chunks), the same to the job:
    each chunk handed over as it comes, attributes and exceptions its own; the GET's event ends
    when a range's bytes have come, the stream ends (``bytes``: what it yielded) or it raises
    (``error``). A stream the job leaves unfinished short of its range has no event."""

    def __init__(self, stream: Any, opened: tuple[int | None, dict[str, Any]]) -> None:
        self._dlreplay_stream = stream
        self._dlreplay_opened: tuple[int | None, dict[str, Any]] | None = opened
        self._dlreplay_bytes = 0

    def __iter__(self) -> CountedStream:
        return self

    def __next__(self) -> Any:
        try:
            chunk = next(self._dlreplay_stream)
        except StopIteration:
            core.guard(HOOK_TC, self._dlreplay_end, False)
            raise
        except BaseException:
            core.guard(HOOK_TC, self._dlreplay_end, True)
            raise
        core.guard(HOOK_TC, self._dlreplay_count, chunk)
        return chunk

    def __getattr__(self, name: str) -> Any:
        return getattr(self._dlreplay_stream, name)

    def _dlreplay_count(self, chunk: Any) -> None:
        """Count a chunk; a range's last chunk ends the event (readers stop iterating there)."""
        self._dlreplay_bytes += len(chunk)
        opened = self._dlreplay_opened
        length = opened[1].get("length") if opened is not None else None
        if length is not None and self._dlreplay_bytes >= length:
            self._dlreplay_end(False)

    def _dlreplay_end(self, error: bool) -> None:
        opened, self._dlreplay_opened = self._dlreplay_opened, None
        if opened is None:
            return
        handle, args = opened
        if error:
            core.REGIONS.end(handle, error=1, **args)
        else:
            core.REGIONS.end(handle, bytes=self._dlreplay_bytes, **args)


def _begin_stream(bucket: Any, key: Any, start: Any, end: Any) -> tuple[int | None, dict[str, Any]]:
    ranged = start is not None or end is not None
    offset = int(start or 0)
    args = {
        "url": f"s3://{bucket}/{key}",
        "bucket": bucket,
        "key": key,
        "offset": offset,
        "length": int(end) - offset if ranged and end is not None else None,
        "client": "s3torchconnector",
    }
    return core.REGIONS.begin(GET, CATEGORY), args


def wrap_get_object_stream(orig: Callable[..., Any]) -> Callable[..., Any]:
    """s3torchconnector's ``S3Client._get_object_stream(bucket, key, start, end)`` (every GET of
    its map and iterable datasets' readers, sequential or range-based) with each GET traced:
    the event spans the request and the stream's transfer (the chunks arrive as the job
    iterates them)."""

    @functools.wraps(orig)
    def wrapper(self: Any, bucket: Any, key: Any, start: Any = None, end: Any = None) -> Any:
        opened = core.guard(HOOK_TC, _begin_stream, bucket, key, start, end)
        try:
            stream = orig(self, bucket, key, start, end)
        except BaseException:
            if opened is not None:
                core.guard(HOOK_TC, core.REGIONS.end, opened[0])
            raise
        return stream if opened is None else CountedStream(stream, opened)

    wrapper._dlreplay_wrapped = True  # type: ignore[attr-defined]
    return wrapper


def _patch_s3torch(mod: Any) -> None:
    cls = getattr(mod, "S3Client", None)
    orig = getattr(cls, "_get_object_stream", None) if cls is not None else None
    if orig is None or getattr(orig, "_dlreplay_wrapped", False):
        return
    cls._get_object_stream = wrap_get_object_stream(orig)  # type: ignore[union-attr]


core.add_patch("botocore.client", _patch_botocore)
core.add_patch("s3torchconnector._s3client._s3client", _patch_s3torch)
core.add_patch("aiobotocore.client", _patch_aiobotocore)
