"""vLLM's sleep mode and worker calls on the offline `LLM` (`loom.engine.core_sleep`)."""

from __future__ import annotations

import functools
import pickle


def _apply_model(func, worker):
    return func(worker.model_runner.model)


class SleepMethods:
    """LLM's sleep, wake_up, is_sleeping, collective_rpc and apply_model."""

    def sleep(self, level: int = 1, mode: str = "abort", tags: list[str] | None = None) -> None:
        """vLLM's: level 1 frees the weights (backed up in host memory) and the KV cache;
        2 discards the weights (wake_up(tags=["weights"]), then collective_rpc
        ("reload_weights") or ("update_weights", args=([(name, tensor), ...],))); 0 only
        pauses. Needs enable_sleep_mode=True."""
        self._check_open()
        with self._lock:
            self.engine.sleep(level, mode, tags)
            self.engine.step()  # hand over what the sleep ended (none between calls)

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Map the memory a sleep freed again: tags "weights" and / or "kv_cache" (None:
        all). Generation resumes once nothing sleeps."""
        self._check_open()
        with self._lock:
            self.engine.wake_up(tags)

    def is_sleeping(self) -> bool:
        return self.engine.is_sleeping()

    def _check_awake(self) -> None:
        if self.engine.is_sleeping():
            raise RuntimeError("LLM: asleep; call wake_up() before generating")

    def collective_rpc(self, method, timeout: float | None = None, args: tuple = (),
                       kwargs: dict | None = None) -> list:
        """vLLM's: a worker method by name (reload_weights, update_weights, model_info,
        allocator_stats, or worker_extension_cls's), or a function called as
        method(worker, *args, **kwargs), on every rank; the results in rank order."""
        self._check_open()
        if timeout is not None:
            raise NotImplementedError("collective_rpc.timeout: loom waits for every rank")
        if not isinstance(method, str) and not callable(method):
            raise ValueError(f"collective_rpc.method: must be a method name or a callable, "
                             f"got {type(method).__name__}")
        if callable(method) and self.engine.executor.local_device is None:
            try:  # the workers are processes of their own
                method = pickle.dumps(method)
            except Exception as e:  # noqa: BLE001 - pickling fails many ways
                raise ValueError(f"collective_rpc.method: workers in other processes take "
                                 f"a picklable function (one defined at module level): "
                                 f"{e}") from None
        with self._lock:
            return self.engine.call_workers(method, list(args), dict(kwargs or {}))

    def apply_model(self, func) -> list:
        """vLLM's: func(model) on every rank's model; the results in rank order."""
        return self.collective_rpc(functools.partial(_apply_model, func))
