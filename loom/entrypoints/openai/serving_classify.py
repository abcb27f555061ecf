"""POST /classify: vLLM's classification API. Each input is one classify request, as
/v1/embeddings sends its inputs; the engine returns the classifier's logits and the model's
activation (`loom.scoring.finish_logits`, plain Python) makes them probabilities."""

from __future__ import annotations

from loom.entrypoints.openai.errors import APIError
from loom.entrypoints.openai.protocol import UsageInfo
from loom.entrypoints.openai.protocol_classify import (ClassificationData,
                                                       ClassificationRequest,
                                                       ClassificationResponse)
from loom.entrypoints.openai.serving_base import OpenAIServing, gather_or_cancel, off_loop


class OpenAIServingClassification(OpenAIServing):
    async def create(self, body: ClassificationRequest) -> ClassificationResponse:
        model, lora = self.resolve_model(body.model)
        if lora is not None:  # as /v1/embeddings refuses them
            raise APIError(400, f"LoRA adapters are not supported for classification: "
                                f"`{model}` is one; use the base model's name", "model")
        params = body.to_pooling_params()
        request_id = self.new_id("classify")
        pairs = await off_loop(lambda: [self.engine.tokenize(p) for p in body.inputs])
        processor = self.engine.processor
        tokenized = [processor.truncate(ids, params.truncate_prompt_tokens, text is not None)
                     for text, ids in pairs]
        for i, token_ids in enumerate(tokenized):  # all valid, or none runs
            processor.process_pooling(f"{request_id}-{i}", token_ids, params)
        outputs = await gather_or_cancel([self.engine.classify(ids, params, f"{request_id}-{i}")
                                          for i, ids in enumerate(tokenized)])
        labels = self.engine.tasks.labels
        data = []
        for i, out in enumerate(outputs):
            probs = out.outputs.probs
            best = max(range(len(probs)), key=probs.__getitem__)
            data.append(ClassificationData(index=i, label=labels[best] if best < len(labels)
                                           else None, probs=probs, num_classes=len(probs)))
        num_tokens = sum(len(out.prompt_token_ids) for out in outputs)
        return ClassificationResponse(id=request_id, model=model, data=data,
                                      usage=UsageInfo(prompt_tokens=num_tokens,
                                                      total_tokens=num_tokens))
