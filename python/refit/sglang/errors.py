"""The SGLang receiver's errors: RefitSglangError, whose instances are also of refit's family class for their status
(refit.core.error_class), so that `except RefitSglangError`, `except RefitTimeout` and `except ValueError` each catch
what they would for any other refit call (the same scheme as refit.vllm.errors).

A setup refit does not handle is REFIT_ERR_UNSUPPORTED (an InputError, hence a ValueError) and names what is not
supported; a failed update carries its pull's status (REFIT_ERR_MISMATCH: a DataError, REFIT_ERR_TIMEOUT: a
RefitTimeout, ...) and names the worker, its layout, the job and the group."""
from ..core import (AuthError, DataError, EnvError, InputError, PeerError, RefitError, RefitTimeout, ReplayError,
                    StaleError, VerifyError, error_class)

UNSUPPORTED = -4  # REFIT_ERR_UNSUPPORTED


class RefitSglangError(RefitError):
    """A setup refit does not handle, or a failed update.  RefitSglangError(detail, call, status) makes an instance of
    the subclass below that is also the status's family class."""

    def __new__(cls, detail: str, call: str = "refit sglang receiver", status: int = UNSUPPORTED):
        if cls is RefitSglangError:
            cls = _BY_FAMILY.get(error_class(status), cls)
        return super().__new__(cls, detail, call, status)

    def __init__(self, detail: str, call: str = "refit sglang receiver", status: int = UNSUPPORTED):
        super().__init__(status, detail, call)


_BY_FAMILY = {}
for _fam in (InputError, DataError, VerifyError, ReplayError, EnvError, RefitTimeout, PeerError, StaleError,
             AuthError):
    _BY_FAMILY[_fam] = type(f"RefitSglang{_fam.__name__.replace('Refit', '')}", (RefitSglangError, _fam),
                            {"__doc__": f"A RefitSglangError of the {_fam.__name__} family.", "__module__": __name__})
    globals()[_BY_FAMILY[_fam].__name__] = _BY_FAMILY[_fam]
del _fam
