"""A workaround for vLLM 0.32's multiprocess executor (docs/vllm.md, known problems): after a collective_rpc that
failed on one worker, the other workers' replies stay queued and answer the next call."""
import pickle
import uuid

from .errors import RefitVllmError


def realign_worker_replies(llm, timeout_s: float = 60.0) -> int:
    """Workaround for vLLM 0.32's multiprocess executor: when a collective_rpc fails on one worker, the executor
    raises at the first error reply and leaves the later workers' replies unread, so every later collective_rpc
    returns those workers' replies one call late (docs/vllm.md; tests/python/test_vllm.py shows it).  This sends a
    marker to every worker and discards each reply queue's entries up to the marker's reply.  Needs the engine core
    in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0); returns the number of stale replies dropped."""
    import cloudpickle
    core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    executor = getattr(getattr(core, "engine_core", None), "model_executor", None)
    mqs = getattr(executor, "response_mqs", None)
    if mqs is None or getattr(executor, "rpc_broadcast_mq", None) is None:
        raise RefitVllmError("realign_worker_replies needs vLLM's multiprocess executor in this process "
                             "(VLLM_ENABLE_V1_MULTIPROCESSING=0 and tensor_parallel_size > 1)")
    token = uuid.uuid4().hex
    executor.rpc_broadcast_mq.enqueue((cloudpickle.dumps(_marker, protocol=pickle.HIGHEST_PROTOCOL), (token,), {},
                                       None))
    dropped = 0
    for mq in mqs:
        while True:
            _status, result = mq.dequeue(timeout=timeout_s)
            if result == token:
                break
            dropped += 1
    return dropped


def _marker(worker, token):
    """Runs in each worker: answers with the token, the end of the stale replies."""
    return token


class quiet_reply_wait:
    """While the block runs, the driver waits for its workers' replies asleep instead of spinning.  vLLM 0.32's
    multiprocess executor reads each worker's reply queue with a SpinCondition that busy-loops (sched_yield) for
    busy_loop_s (1 s) after its last read; during a commit, whose workers copy on every CPU, that spinning thread
    takes CPU from them (on this 2-core host the driver's thread ran 18 ms of a 42 ms tp=2 commit).  With
    busy_loop_s 0 the read sleeps in zmq's poll until the writer's notification.  A no-op where the executor is not
    in this process or its queues lack the attribute (`changed` says which); the values are restored on exit."""

    def __init__(self, llm):
        core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        executor = getattr(getattr(core, "engine_core", None), "model_executor", None)
        self.conds = [c for c in (getattr(mq, "_spin_condition", None)
                                  for mq in (getattr(executor, "response_mqs", None) or []))
                      if c is not None and isinstance(getattr(c, "busy_loop_s", None), (int, float))]
        self.saved = []
        self.changed = False

    def __enter__(self):
        self.saved = [c.busy_loop_s for c in self.conds]
        for c in self.conds:
            c.busy_loop_s = 0
        self.changed = bool(self.conds)
        return self

    def __exit__(self, *exc):
        for c, v in zip(self.conds, self.saved):
            c.busy_loop_s = v
        return False
