"""The vLLM backend's errors: RefitVllmError, whose instances are also of refit's family class for their status
(refit.core.error_class), so that `except RefitVllmError`, `except RefitTimeout` and `except ValueError` each
catch what they would for any other refit call.

A setup refit does not handle is REFIT_ERR_UNSUPPORTED (an InputError, hence a ValueError) and names what is not
supported; a failed update carries its pull's status (REFIT_ERR_MISMATCH: a DataError, REFIT_ERR_TIMEOUT: a
RefitTimeout) and names the worker, its layout, the job and the group."""
from ..core import (AuthError, DataError, EnvError, InputError, PeerError, RefitError, RefitTimeout, ReplayError,
                    StaleError, VerifyError, error_class)


class RefitVllmError(RefitError):
    """A vLLM setup refit does not handle (REFIT_ERR_UNSUPPORTED, naming it), or a failed update (the pull's
    status, e.g. REFIT_ERR_MISMATCH, with the worker and its layout).  RefitVllmError(detail, call, status) makes
    an instance of the subclass below that is also the status's family class."""

    def __new__(cls, detail: str, call: str = "refit vllm backend", status: int = -4):
        if cls is RefitVllmError:
            cls = _BY_FAMILY.get(error_class(status), cls)
        return super().__new__(cls, detail, call, status)

    def __init__(self, detail: str, call: str = "refit vllm backend", status: int = -4):
        super().__init__(status, detail, call)


class RefitVllmInputError(RefitVllmError, InputError):
    """A RefitVllmError of the input family (an unsupported setup: REFIT_ERR_UNSUPPORTED); also a ValueError."""


class RefitVllmDataError(RefitVllmError, DataError):
    """A RefitVllmError of the data family (a failed update: REFIT_ERR_MISMATCH, REFIT_ERR_UNCOVERED, ...)."""


class RefitVllmVerifyError(RefitVllmError, VerifyError):
    """A failed update whose pull found wrong bytes (REFIT_ERR_VERIFY)."""


class RefitVllmReplayError(RefitVllmError, ReplayError):
    """A failed update whose registry value named other bytes than its source holds (REFIT_ERR_REPLAY)."""


class RefitVllmEnvError(RefitVllmError, EnvError):
    """A RefitVllmError of the environment family (memory, I/O, peers, servers)."""


class RefitVllmTimeout(RefitVllmError, RefitTimeout):
    """A failed update whose pull timed out (REFIT_ERR_TIMEOUT)."""


class RefitVllmPeerError(RefitVllmError, PeerError):
    """A failed update whose peer died or misbehaved (REFIT_ERR_PEER)."""


class RefitVllmStaleError(RefitVllmError, StaleError):
    """A failed update whose version was replaced or retired (REFIT_ERR_STALE)."""


class RefitVllmAuthError(RefitVllmError, AuthError):
    """A failed update whose entry or peer did not prove the job's secret (REFIT_ERR_AUTH)."""


_BY_FAMILY = {InputError: RefitVllmInputError, DataError: RefitVllmDataError, VerifyError: RefitVllmVerifyError,
              ReplayError: RefitVllmReplayError, EnvError: RefitVllmEnvError, RefitTimeout: RefitVllmTimeout,
              PeerError: RefitVllmPeerError, StaleError: RefitVllmStaleError, AuthError: RefitVllmAuthError}
