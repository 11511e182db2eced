"""The backend's init_info and update_info (vLLM builds them from the dicts a caller passes to
init_weight_transfer_engine and update_weights).  A bad field raises refit's InputError (a ValueError) or, for a
value of the wrong type, ArgumentTypeError (also a TypeError, which vLLM's parser re-raises as a ValueError)."""
from dataclasses import dataclass
from typing import Optional, Union

from vllm.distributed.weight_transfer.base import WeightTransferInitInfo, WeightTransferUpdateInfo

from ..core import _arg_error, _type_error


def _string(call: str, key: str, v, optional: bool):
    """A non-empty string (or None when optional), or the error naming the field."""
    if v is None and optional:
        return
    when = " when given" if optional else ""
    if not isinstance(v, str):
        raise _type_error(f"{key} must be a non-empty string{when}, not {v!r}", call)
    if not v:
        raise _arg_error(f"{key} must be a non-empty string{when}, not {v!r}", call)


def _integer(call: str, key: str, v, what: str):
    """An int (not a bool), or the type error naming the field; the caller checks its range."""
    if isinstance(v, bool) or not isinstance(v, int):
        raise _type_error(f"{key} must be {what}, not {v!r}", call)


@dataclass
class RefitInitInfo(WeightTransferInitInfo):
    """init_info of init_weight_transfer_engine.  registry: "file:DIR" or "redis://HOST:PORT"; job: the job name
    the publishers use; group: the publishers' group; transports: e.g. "shm,ucx" (None: the library's default);
    timeout_ms: how long a pull waits for a version; model: the model name the publishers publish under, when it
    differs from the one refit derives from vLLM's model path (the config directory's base name); stage: "none"
    (an update pulls into the live weights, the engine paused throughout) or "host" (two-phase: stage while
    serving, commit under a pause; refit.vllm.inflight); staging_budget: the host bytes stage="host" may use;
    stage_threads: the shm copy threads of a stage's pull (default 1, leaving the other cores to the engine; 0: the
    library's default, one per CPU); commit_copy: how a two-phase commit copies host bytes: "torch" (the
    default: flat byte copies by torch's kernel over the worker's intra-op threads, idle during the pause; on a quiet
    2-core host 0.65-0.88x the pause of "memmove", docs/vllm.md) or "memmove" (one memmove per tensor in the calling
    thread: steadier where other busy processes share the engine's cores); staging_hugepages:
    the CPU staging memory of stage="host" in transparent huge pages (default false: no gain measured, docs/vllm.md);
    draft_group: the publishers' group of the speculative draft model (refit.vllm.draft; default: group, right for
    a DeepSeek MTP draft, whose tensors the target's publishers hold); draft_model: the model name the draft's
    publishers publish under (default: the target's for an MTP draft, the draft's config directory's base name for
    a draft model of its own)."""
    registry: str
    job: str
    group: str = "trainer"
    transports: Optional[str] = None
    timeout_ms: int = 60000
    model: Optional[str] = None
    transport_options: Optional[str] = None
    stage: str = "none"
    staging_budget: Optional[int] = None
    stage_threads: int = 1
    commit_copy: str = "torch"
    staging_hugepages: bool = False
    draft_group: Optional[str] = None
    draft_model: Optional[str] = None

    def __post_init__(self):
        call = "refit init_info"
        if self.stage not in ("none", "host"):
            raise _arg_error(f"stage must be \"none\" (single-phase updates) or \"host\" (stage, then commit), "
                             f"not {self.stage!r}", call)
        if not isinstance(self.staging_hugepages, bool):
            raise _type_error(f"staging_hugepages must be true or false, not {self.staging_hugepages!r}", call)
        if self.commit_copy not in ("torch", "memmove"):
            raise _arg_error(f"commit_copy must be \"torch\" or \"memmove\", not {self.commit_copy!r}", call)
        _integer(call, "stage_threads", self.stage_threads, "a non-negative integer")
        if self.stage_threads < 0:
            raise _arg_error(f"stage_threads must be a non-negative integer, not {self.stage_threads!r}", call)
        if self.staging_budget is not None:
            _integer(call, "staging_budget", self.staging_budget, "a positive number of bytes")
            if self.staging_budget <= 0:
                raise _arg_error(f"staging_budget must be a positive number of bytes, not {self.staging_budget!r}",
                                 call)
        for k in ("registry", "job", "group"):
            _string(call, k, getattr(self, k), optional=False)
        for k in ("transports", "model", "transport_options", "draft_group", "draft_model"):
            _string(call, k, getattr(self, k), optional=True)
        _integer(call, "timeout_ms", self.timeout_ms, "a positive integer")
        if self.timeout_ms <= 0:
            raise _arg_error(f"timeout_ms must be a positive integer, not {self.timeout_ms!r}", call)


PHASES = ("update", "stage", "commit", "abort")


@dataclass
class RefitUpdateInfo(WeightTransferUpdateInfo):
    """update_info of update_weights: {"version": N} pulls version N, {"version": "newest"} (the default) the
    newest complete version newer than the one held.  phase (init_info stage="host" only, except "update"):
    "update" (stage and commit at once), "stage" (start staging N, return at once), "commit" (make the staged N
    live), "abort" (drop what is staged)."""
    version: Union[int, str] = "newest"
    phase: str = "update"
    # phase "commit": the caller read every worker's versions() right before this call and each had this version
    # staged, nothing staging and nothing mixed (refit.vllm.inflight.commit does): the workers then commit without
    # agreeing among themselves under the pause.  Without it (the default) they agree there first.
    staged_everywhere: bool = False

    def __post_init__(self):
        v, call = self.version, "refit update_info"
        if self.phase not in PHASES:
            raise _arg_error(f"phase must be one of {', '.join(PHASES)}, not {self.phase!r}", call)
        if not isinstance(self.staged_everywhere, bool):
            raise _arg_error(f"staged_everywhere must be true or false, not {self.staged_everywhere!r}", call)
        if self.staged_everywhere and self.phase != "commit":
            raise _arg_error(f"staged_everywhere goes with phase \"commit\", not {self.phase!r}", call)
        if v == "newest":
            return
        what = "a positive integer or \"newest\""
        if isinstance(v, str):
            raise _arg_error(f"version must be {what}, not {v!r}", call)
        _integer(call, "version", v, what)
        if v < 1:
            raise _arg_error(f"version must be {what}, not {v!r}", call)
