"""Prometheus metrics of refit through prometheus-client (docs/operations.md).

The library counts every pull and publish of the process (refit/metrics.h): seconds per phase, bytes per
transport and lane, failures by status name, versions, delta ratios, digest bytes.  This module offers them to
prometheus-client:

    from prometheus_client import REGISTRY, start_http_server
    import refit.metrics
    REGISTRY.register(refit.metrics.LibraryCollector())      # this process's publishers and receivers
    start_http_server(9400, addr="127.0.0.1")

``LibraryCollector(path)`` reads a textfile another process wrote (REFIT_METRICS_FILE) instead.  Without
prometheus-client, ``text()``, ``write_file()`` and ``serve()`` give the library's own exposition.
"""
import ctypes as C
from typing import Iterator, Optional

from ._lib import lib

_SIGS = {
    "refit_metrics_text": ([C.POINTER(C.c_void_p), C.POINTER(C.c_size_t)], C.c_int),
    "refit_metrics_write_file": ([C.c_char_p], C.c_int),
    "refit_metrics_serve": ([C.c_char_p, C.c_char_p, C.c_size_t], C.c_int),
    "refit_metrics_stop": ([], None),
    "refit_metrics_reset": ([], None),
}
_libc = C.CDLL(None)
_libc.free.argtypes = [C.c_void_p]


def _fn(name: str):
    """The library's function, declared on first use (importing refit works with a library built before it)."""
    f = getattr(lib, name)
    f.argtypes, f.restype = _SIGS[name]
    return f


def _check(st: int, what: str):
    if st != 0:
        from .core import _check as check  # RefitError with the status name and the library's detail
        check(st, what)


def text() -> str:
    """This process's metrics in the Prometheus text format (0.0.4)."""
    p, n = C.c_void_p(), C.c_size_t()
    _check(_fn("refit_metrics_text")(C.byref(p), C.byref(n)), "refit_metrics_text")
    try:
        return C.string_at(p, n.value).decode()
    finally:
        _libc.free(p)


def write_file(path: str):
    """Writes them to path atomically (as REFIT_METRICS_FILE does after every pull and publish)."""
    _check(_fn("refit_metrics_write_file")(path.encode()), f"refit_metrics_write_file({path})")


def serve(addr: str = "127.0.0.1:0") -> str:
    """Starts the library's HTTP endpoint (GET /metrics) on addr; returns "IP:PORT" as bound."""
    buf = C.create_string_buffer(80)
    _check(_fn("refit_metrics_serve")(addr.encode(), buf, len(buf)), f"refit_metrics_serve({addr})")
    return buf.value.decode()


def stop():
    _fn("refit_metrics_stop")()


def reset():
    """Forgets every value (tests; a process that starts another job)."""
    _fn("refit_metrics_reset")()


try:
    from prometheus_client.parser import text_string_to_metric_families
    from prometheus_client.registry import Collector as _Collector
except ImportError:  # prometheus-client is optional
    text_string_to_metric_families = None
    _Collector = object


class LibraryCollector(_Collector):
    """A prometheus-client collector of refit's metrics: this process's (path=None), or the textfile `path` that
    a refit process writes (REFIT_METRICS_FILE).  Each collect() reads them afresh; names, types, labels and
    values are the library's own (docs/operations.md)."""

    def __init__(self, path: Optional[str] = None):
        if text_string_to_metric_families is None:
            raise ImportError("refit.metrics.LibraryCollector needs prometheus-client (pip install prometheus-client)")
        self.path = path

    def collect(self) -> Iterator:
        if self.path is None:
            body = text()
        else:
            try:
                with open(self.path) as f:
                    body = f.read()
            except FileNotFoundError:  # the process has not pulled or published yet
                return
        yield from text_string_to_metric_families(body)
