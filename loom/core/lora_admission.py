"""vLLM's max_loras in the scheduler: the running requests use at most that many adapters.

Every step's requests are running ones, so each step then fits the workers' adapter slots.
A waiting request whose adapter would be one too many is passed over, and requests behind
it (the base model's, or an adapter's already running) go ahead; it is admitted once the
requests of some running adapter have all finished. An adapter that the workers failed to
load ends its requests (`failed`).
"""

from __future__ import annotations

from collections.abc import Iterable

from loom.core.request import Request
from loom.core.sched_output import ModelRunnerOutput


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

    @staticmethod
    def failed(step: ModelRunnerOutput, requests: dict[str, Request]) -> dict[str, str]:
        """The requests that a step's adapter load failures (its lora_errors) end, request
        id -> error: every request of a failed adapter, running or waiting, while any of
        the step's own requests with it is unfinished. Those ran without it; running ones
        scheduled since may have reused the prefix-cache blocks they wrote. The same failure
        reported again by a later step (launched before the first report was read) then
        ends nothing: requests added since read the adapter afresh, and their own steps
        report for them."""
        if not step.lora_errors:
            return {}

        def lora_id(rid: str) -> int | None:
            request = requests.get(rid)
            return request.lora_request.lora_int_id if request and request.lora_request else None
        live = {lora_id(rid) for rid in step.req_ids} & step.lora_errors.keys()
        return {rid: step.lora_errors[i] for rid in requests if (i := lora_id(rid)) in live}

    def admitted(self, request: Request) -> None:
        if request.lora_request is not None and self.max_loras is not None:
            self.active.add(request.lora_request.lora_int_id)
