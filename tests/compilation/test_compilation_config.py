"""`-O` / `compilation_config`: every field's type is checked, with the field named (these
were tracebacks, or silently misread: a string of splitting ops split into characters)."""

import pytest

from loom.config import CompilationConfig

BAD = [
    ('{"compile_sizes": 5}', "compile_sizes"),
    ('{"compile_sizes": [true]}', "compile_sizes"),
    ('{"pass_config": 5}', "pass_config"),
    ('{"pass_config": {"enable_noop": "no"}}', "enable_noop"),
    ('{"level": 3, "splitting_ops": 5}', "splitting_ops"),
    ('{"level": 3, "splitting_ops": "attention"}', "splitting_ops"),
    ('{"cudagraph_capture_sizes": [-1, "a"]}', "cudagraph_capture_sizes"),
    ('{"cudagraph_capture_sizes": 8}', "cudagraph_capture_sizes"),
    ('{"level": true}', "level"),
    ('{"level": 7}', "level"),
]


@pytest.mark.parametrize("text, field", BAD)
def test_bad_values_name_the_field(text, field):
    with pytest.raises(ValueError, match=f"compilation_config.*{field}"):
        CompilationConfig.parse(text)


def test_good_values_still_parse():
    cfg = CompilationConfig.parse('{"level": 3, "compile_sizes": [8192], "splitting_ops": [], '
                                  '"cudagraph_capture_sizes": [1, 2], '
                                  '"pass_config": {"enable_async_tp": true}}')
    assert cfg.compile_sizes == (8192,) and cfg.splitting_ops == ()
    assert cfg.cudagraph_capture_sizes == (1, 2) and cfg.pass_config.enable_sequence_parallelism
    assert CompilationConfig.parse("3").level == 3


@pytest.mark.parametrize("value", [{"mode": 3}, '{"mode": 3}', '{"mode": 3, "level": 3}'])
def test_mode_is_vllms_newer_name_for_level(value):
    cfg = CompilationConfig.parse(value)
    assert cfg.level == cfg.mode == 3
    assert CompilationConfig(mode=2).level == 2 and CompilationConfig(level=1).mode == 1
    assert CompilationConfig().level is None and CompilationConfig().mode is None


@pytest.mark.parametrize("mode, decode, pieces", [
    ("NONE", False, False), ("PIECEWISE", False, True), ("FULL", True, True),
    ("FULL_DECODE_ONLY", True, False), ("FULL_AND_PIECEWISE", True, True)])
def test_vllms_cudagraph_modes(mode, decode, pieces):
    """Which batches replay graphs: whole-forward ones for pure decodes, and the pieces
    between attention calls for the rest (FULL's mixed batches can only take pieces here)."""
    config = CompilationConfig.parse({"cudagraph_mode": mode})
    assert (config.decode_graphs, config.piece_graphs) == (decode, pieces)


def test_an_unset_level_is_the_devices_default():
    """As vLLM: level 3 on CUDA unless given; loom keeps the CPU eager. The level-3 passes,
    asked for with no level, take level 3 anywhere; a level that was set stays."""
    unset = CompilationConfig()
    assert unset.resolved("cuda").level == unset.resolved("cuda").mode == 3
    assert unset.resolved("cpu").level == unset.resolved("cpu").mode == 0
    sp = CompilationConfig.parse('{"pass_config": {"enable_async_tp": true}}')
    assert sp.resolved("cpu").level == 3
    for level in range(4):
        assert CompilationConfig(level=level).resolved("cuda").level == level


def test_the_runner_resolves_the_level_for_its_device():
    import torch

    from loom.config import EngineConfig, ModelConfig
    from loom.worker.model_runner import resolved_for_device
    config = EngineConfig(ModelConfig(model="x"))
    assert resolved_for_device(config, torch.device("cpu")).compilation.level == 0
    explicit = EngineConfig(ModelConfig(model="x"), compilation=CompilationConfig(level=3))
    assert resolved_for_device(explicit, torch.device("cpu")).compilation.level == 3


@pytest.mark.parametrize("value, message", [
    ('{"mode": 3, "level": 0}', "level 0 and mode 3 differ"),
    ({"mode": 7}, "compilation_config.mode: must be 0-3, got 7"),
    ('{"mode": true}', "compilation_config.mode: must be 0-3, got True"),
    ("\u00b2", "compilation_config: not valid JSON"),  # '²'.isdigit() is true; int() fails
])
def test_bad_mode_or_level_is_a_clear_error(value, message):
    with pytest.raises(ValueError, match=message):
        CompilationConfig.parse(value)
    if isinstance(value, dict):
        with pytest.raises(ValueError, match=message):
            CompilationConfig(**value)


def test_level_and_mode_survive_the_wire():
    import msgspec

    from loom.config import EngineConfig, ModelConfig
    config = EngineConfig(ModelConfig(model="x"), compilation=CompilationConfig(mode=3))
    decoded = msgspec.json.decode(msgspec.json.encode(config), type=EngineConfig)
    assert decoded == config and decoded.compilation.level == 3
    unset = EngineConfig(ModelConfig(model="x"))  # resolved by each worker, not before
    decoded = msgspec.json.decode(msgspec.json.encode(unset), type=EngineConfig)
    assert decoded == unset and decoded.compilation.level is None


@pytest.mark.parametrize("name, level", [("NONE", 0), ("stock_torch_compile", 1),
                                         ("Dynamo_Trace_Once", 2), ("vllm_compile", 3)])
def test_mode_takes_vllms_compilation_mode_names(name, level):
    """vLLM's CompilationMode: NONE, STOCK_TORCH_COMPILE, DYNAMO_TRACE_ONCE, VLLM_COMPILE are
    0-3, parsed from their names in any case; its IntEnum members are their numbers."""
    import enum
    cfg = CompilationConfig.parse(f'{{"mode": "{name}"}}')
    assert cfg.level == cfg.mode == level and type(cfg.mode) is int
    members = enum.IntEnum("CompilationMode", [("NONE", 0), ("VLLM_COMPILE", 3)])
    assert CompilationConfig(mode=members.VLLM_COMPILE).level == 3
    assert type(CompilationConfig(mode=members.VLLM_COMPILE).mode) is int
    with pytest.raises(ValueError, match="mode: 'fastest' is not one of 0-3 or .*VLLM_COMPILE"):
        CompilationConfig.parse({"mode": "fastest"})


def test_cudagraph_mode_takes_any_case():
    assert CompilationConfig.parse({"cudagraph_mode": "piecewise"}).cudagraph_mode == "PIECEWISE"
    assert CompilationConfig(cudagraph_mode="Full_Decode_Only").decode_graphs
    with pytest.raises(ValueError, match="cudagraph_mode: must be one of .*got 'sometimes'"):
        CompilationConfig.parse({"cudagraph_mode": "sometimes"})


@pytest.mark.parametrize("newer, older", [("enable_sp", "enable_sequence_parallelism"),
                                          ("fuse_gemm_comms", "enable_async_tp"),
                                          ("eliminate_noops", "enable_noop"),
                                          ("fuse_allreduce_rms", "enable_all_reduce_norm_fusion")])
def test_pass_config_takes_vllms_newer_names(newer, older):
    for value in (True, False):
        got = CompilationConfig.parse({"pass_config": {newer: value}}).pass_config
        assert got == CompilationConfig.parse({"pass_config": {older: value}}).pass_config
    assert CompilationConfig.parse({"pass_config": {newer: True, older: True}}).pass_config \
        == CompilationConfig.parse({"pass_config": {older: True}}).pass_config
    with pytest.raises(ValueError, match=f"pass_config: {newer} and {older} differ"):
        CompilationConfig.parse({"pass_config": {newer: True, older: False}})


def test_pass_config_accepts_vllms_fp8_quant_fusions(caplog):
    """vLLM's flags for fusing fp8 quantization: accepted, and where on, one line says they
    match nothing (no loom model holds fp8 quantization ops)."""
    import logging
    caplog.set_level(logging.INFO, logger="loom.compilation_config")
    cfg = CompilationConfig.parse({"pass_config": {"fuse_norm_quant": False,
                                                   "enable_fusion": True}})
    assert cfg.pass_config == CompilationConfig().pass_config
    assert [r.getMessage() for r in caplog.records] == [
        "compilation_config.pass_config.enable_fusion: fuses fp8 quantization ops, which no "
        "loom model has; it matches nothing"]
    with pytest.raises(ValueError, match="pass_config.fuse_act_quant: must be true or false"):
        CompilationConfig.parse({"pass_config": {"fuse_act_quant": "yes"}})


def test_max_cudagraph_capture_size_caps_the_default_sizes():
    from types import SimpleNamespace

    import torch

    from loom.config import EngineConfig, ModelConfig, SchedulerConfig
    from loom.worker.model_runner import ModelRunner

    def sizes(compilation: dict, max_num_seqs: int = 256) -> list[int]:
        config = EngineConfig(ModelConfig(model="x"), compilation=CompilationConfig.parse(
            compilation), scheduler=SchedulerConfig(max_num_seqs=max_num_seqs))
        runner = SimpleNamespace(config=config, device=torch.device("cuda"), token_multiple=1)
        return ModelRunner.decode_graph_sizes(runner)
    assert sizes({}) == [1, 2, 4] + list(range(8, 257, 8))
    assert sizes({"max_cudagraph_capture_size": 20}) == [1, 2, 4, 8, 16]
    assert sizes({"max_cudagraph_capture_size": 512}, max_num_seqs=16) == [1, 2, 4, 8, 16]
    assert sizes({"cudagraph_capture_sizes": [3, 6], "max_cudagraph_capture_size": 6}) == [3, 6]
    for bad, message in [({"max_cudagraph_capture_size": 0}, "must be a positive integer"),
                         ({"cudagraph_capture_sizes": [1, 2], "max_cudagraph_capture_size": 4},
                          "4 is not the largest of cudagraph_capture_sizes")]:
        with pytest.raises(ValueError, match=f"max_cudagraph_capture_size: {message}"):
            CompilationConfig.parse(bad)


def test_compile_sizes_take_vllms_capture_sizes_entry():
    """vLLM's compile_sizes entry "cudagraph_capture_sizes" stands for the decode capture
    sizes: the given list, or (once the runner knows max_num_seqs) the default one."""
    import torch

    from loom.config import EngineConfig, ModelConfig, SchedulerConfig
    from loom.worker.model_runner import resolved_for_device
    given = CompilationConfig.parse({"compile_sizes": ["cudagraph_capture_sizes", 64, 2],
                                     "cudagraph_capture_sizes": [1, 2, 4]})
    assert given.compile_sizes == (1, 2, 4, 64)

    def resolved(compilation: str, max_num_seqs: int) -> tuple:
        config = EngineConfig(ModelConfig(model="x"), compilation=CompilationConfig.parse(
            compilation), scheduler=SchedulerConfig(max_num_seqs=max_num_seqs))
        return resolved_for_device(config, torch.device("cpu")).compilation.compile_sizes
    assert resolved('{"level": 3, "compile_sizes": ["cudagraph_capture_sizes"]}', 20) \
        == (1, 2, 4, 8, 16)
    assert resolved('{"compile_sizes": [100, "cudagraph_capture_sizes"], '
                    '"max_cudagraph_capture_size": 8}', 256) == (1, 2, 4, 8, 100)
    assert resolved('{"compile_sizes": [100]}', 256) == (100,)
    with pytest.raises(ValueError, match='compile_sizes: must be a list of positive integers or '
                                         '"cudagraph_capture_sizes", got .*capture_size'):
        CompilationConfig.parse('{"compile_sizes": ["capture_size"]}')


def test_vllms_other_fields_are_named_as_such():
    """vLLM's backend is Inductor here (its default, accepted); its other CompilationConfig
    fields without a counterpart are refused as vLLM options, not as unknown names."""
    assert CompilationConfig.parse({"backend": "inductor", "mode": 3}).level == 3
    assert CompilationConfig.parse({"backend": ""}) == CompilationConfig()
    with pytest.raises(ValueError, match="backend: loom compiles with Inductor only .*'eager'"):
        CompilationConfig.parse({"backend": "eager"})
    with pytest.raises(ValueError, match=r"\['cache_dir', 'custom_ops'\]: vLLM option\(s\) that "
                                         "loom does not implement"):
        CompilationConfig.parse('{"custom_ops": ["+rms_norm"], "cache_dir": "/tmp/x"}')
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['nonsense'\]"):
        CompilationConfig.parse({"nonsense": 1})
