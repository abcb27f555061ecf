"""The names a server answers to: the base model's (--served-model-name) and one per LoRA
adapter (vLLM's --lora-modules), which requests name in `model` to run with that adapter."""

from __future__ import annotations

import json
from collections.abc import Iterable

import msgspec

from loom.entrypoints.openai.errors import APIError
from loom.entrypoints.openai.protocol import ModelCard
from loom.lora.request import LoRARequest

_JSON_KEYS = {"name", "path", "base_model_name"}


class LoRAModule(msgspec.Struct, frozen=True):
    """One --lora-modules item (vLLM's LoRAModulePath): `name=path`, or a JSON object."""
    name: str
    path: str
    base_model_name: str | None = None
    """The model /v1/models names as the adapter's parent; None: the served model."""


def parse_lora_module(item: str) -> LoRAModule:
    """`name=path`, or vLLM's '{"name": ..., "path": ..., "base_model_name": ...}'."""
    if item.lstrip().startswith("{"):
        return _json_module(item)
    name, eq, path = item.partition("=")
    if not (eq and name.strip() and path.strip()):
        raise ValueError(f"lora_modules: {item!r} is neither name=path nor a JSON object "
                         "with \"name\" and \"path\"")
    return LoRAModule(name.strip(), path.strip())


def _json_module(item: str) -> LoRAModule:
    try:
        fields = json.loads(item)
    except ValueError as e:
        raise ValueError(f"lora_modules: {item!r} is not valid JSON ({e})") from None
    if not isinstance(fields, dict) or set(fields) - _JSON_KEYS:
        raise ValueError(f"lora_modules: {item!r} must be a JSON object of "
                         f"{sorted(_JSON_KEYS)}")
    for key in ("name", "path"):
        if not isinstance(fields.get(key), str) or not fields[key]:
            raise ValueError(f"lora_modules: {item!r} needs a non-empty string {key!r}")
    base = fields.get("base_model_name")
    if base is not None and not isinstance(base, str):
        raise ValueError(f"lora_modules: {item!r}: base_model_name must be a string")
    return LoRAModule(fields["name"], fields["path"], base)


def parse_lora_modules(items: Iterable[str], served_names: list[str]) -> list[LoRAModule]:
    """Every --lora-modules item, each name new: not another adapter's, not the model's."""
    modules: list[LoRAModule] = []
    for item in items:
        module = parse_lora_module(item)
        check_new_name(module.name, served_names, [m.name for m in modules], "lora_modules")
        modules.append(module)
    return modules


def check_new_name(name: str, served_names: list[str], adapter_names: Iterable[str],
                   field: str) -> None:
    if name in served_names:
        raise ValueError(f"{field}: {name!r} is the served model's name; give the adapter "
                         "another")
    if name in adapter_names:
        raise ValueError(f"{field}: an adapter is already named {name!r}")


def lora_requests(modules: list[LoRAModule]) -> list[LoRARequest]:
    """The adapters' requests, ids 1, 2, ... in the order given (every API process agrees)."""
    return [LoRARequest(m.name, i, m.path) for i, m in enumerate(modules, 1)]


class _Adapter(msgspec.Struct, frozen=True):
    request: LoRARequest
    parent: str


class ServingModels:
    """What `model` in a request may name, shared by every endpoint of one API server, so
    that an adapter loaded at run time is served by all of them at once."""

    def __init__(self, served_model_names: list[str], root: str | None = None,
                 lora_modules: list[LoRAModule] | tuple = ()) -> None:
        self.served_model_names = served_model_names
        self.root = root
        """The base model's path, /v1/models' `root`."""
        self.adapters: dict[str, _Adapter] = {}
        for request, module in zip(lora_requests(list(lora_modules)), lora_modules):
            self._add(request, module.base_model_name)
        self._next_id = len(self.adapters) + 1
        """Ids are never reused: an unloaded adapter's may still key cached prefixes."""

    @property
    def base_name(self) -> str:
        """The name responses report for the base model, whichever alias was asked for."""
        return self.served_model_names[0]

    def resolve(self, model: str | None) -> tuple[str, LoRARequest | None]:
        """(the name to answer with, the adapter to run with); a 404 for an unknown model.
        No `model`, or any of the base model's names, runs the base model."""
        if model is None or model in self.served_model_names:
            return self.base_name, None
        adapter = self.adapters.get(model)
        if adapter is None:
            raise APIError(404, f"The model `{model}` does not exist.", "model")
        return model, adapter.request

    def cards(self, max_model_len: int) -> list[ModelCard]:
        """/v1/models: the base model under each of its names, then each adapter, as vLLM."""
        base = [ModelCard(id=name, root=self.root, max_model_len=max_model_len)
                for name in self.served_model_names]
        return base + [ModelCard(id=name, root=a.request.lora_path, parent=a.parent)
                       for name, a in self.adapters.items()]

    def new_adapter(self, name: str, path: str) -> LoRARequest:
        """The request of an adapter loaded at run time: a new name, a fresh id. Served
        once `register`ed, after the engine's check of its files."""
        check_new_name(name, self.served_model_names, self.adapters, "lora_name")
        request = LoRARequest(name, self._next_id, path)
        self._next_id += 1
        return request

    def register(self, request: LoRARequest) -> None:
        # Again: another load of the same name may have passed while this one was checked.
        check_new_name(request.lora_name, self.served_model_names, self.adapters, "lora_name")
        self._add(request, None)

    def remove(self, name: str) -> None:
        if self.adapters.pop(name, None) is None:
            raise APIError(404, f"The LoRA adapter `{name}` does not exist.", "lora_name")

    def _add(self, request: LoRARequest, parent: str | None) -> None:
        self.adapters[request.lora_name] = _Adapter(request, parent or self.base_name)
