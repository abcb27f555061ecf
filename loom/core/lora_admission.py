"""vLLM's max_loras in the scheduler: the running requests use at most that many adapters.

Every step's requests are running ones, so each step then fits the workers' adapter slots.
A waiting request whose adapter would be one too many is passed over, and requests behind
it (the base model's, or an adapter's already running) go ahead; it is admitted once the
requests of some running adapter have all finished.
"""

from __future__ import annotations

from collections.abc import Iterable

from loom.core.request import Request


class LoRAAdmission:
    def __init__(self, max_loras: int | None) -> None:
        """max_loras: None when LoRA is off (every request is admitted)."""
        self.max_loras = max_loras
        self.active: set[int] = set()

    def begin(self, running: Iterable[Request]) -> None:
        """Before one step's admissions: the adapters the running requests use."""
        if self.max_loras is not None:
            self.active = {r.lora_request.lora_int_id for r in running if r.lora_request}

    def admits(self, request: Request) -> bool:
        lora = request.lora_request
        return (lora is None or self.max_loras is None or lora.lora_int_id in self.active
                or len(self.active) < self.max_loras)

    def stats(self, running: Iterable[Request], waiting: Iterable[Request]) -> dict:
        """SchedulerStats' LoRA fields ({} when LoRA is off)."""
        if self.max_loras is None:
            return {}

        def names(requests: Iterable[Request]) -> list[str]:
            return sorted({r.lora_request.lora_name for r in requests if r.lora_request})
        return {"max_loras": self.max_loras, "running_lora_adapters": names(running),
                "waiting_lora_adapters": names(waiting)}

    def admitted(self, request: Request) -> None:
        if request.lora_request is not None and self.max_loras is not None:
            self.active.add(request.lora_request.lora_int_id)
