"""The engine's command-line flags (vLLM's names), registered by `EngineArgs.add_cli_args`;
each flag's dest is an `EngineArgs` field."""

from __future__ import annotations

import argparse
import re

from loom.config import (CONVERTS, DEVICES, DTYPE_ALIASES, DTYPES, KV_CACHE_DTYPES,
                         LOAD_FORMATS, LOGPROBS_MODES, RUNNERS, SCHEDULING_POLICIES)
from loom.lora_config import LORA_DTYPES
from loom.tasks import TASK_FLAG

TRUST_REMOTE_CODE_HELP = ("accepted for vLLM compatibility and ignored: loom never runs code "
                          "from a model's repository; it reads only configs, weights and "
                          "tokenizers")


SWAP_SPACE_HELP = ("accepted for vLLM compatibility (GiB of CPU memory for preempted "
                   "requests' KV blocks): loom preempts by recomputing, as vLLM's V1 engine "
                   "does, so none is reserved")
CHUNKED_PREFILL_HELP = ("accepted for vLLM compatibility: loom always schedules a prompt in "
                        "chunks of at most --max-num-batched-tokens beside running decodes, as "
                        "vLLM's V1 engine; --no-enable-chunked-prefill is refused")


_HUMAN_INT = re.compile(r"(-?\d+(?:\.\d+)?)([kmgtKMGT]?)")


def human_int(text: str) -> int:
    """vLLM's human-readable integers: a lowercase suffix is a power of 1000 (25.6k is
    25600), an uppercase one a power of 1024 (whole numbers only: 16K is 16384)."""
    match = _HUMAN_INT.fullmatch(text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(f"invalid integer: {text!r} (e.g. 4096, 32k, 32K)")
    number, suffix = match.groups()
    if not suffix or suffix.isupper():
        if "." in number:
            raise argparse.ArgumentTypeError(
                f"invalid integer: {text!r}; a fraction takes a decimal suffix (k, m, g, t)")
        return int(number) * 1024 ** (" KMGT".index(suffix or " "))
    return round(float(number) * 1000 ** (" kmgt".index(suffix)))


def add_engine_flags(parser: argparse.ArgumentParser, model_positional: bool = False) -> None:
    g = parser.add_argument_group("engine")
    g.add_argument("--config", metavar="FILE", default=None,
                   help="a YAML file of this command's options by name (vLLM's), read "
                        "before the command line, whose flags win (loom/cli_config.py)")
    g.add_argument("--model", default=None, help="model directory, .gguf file, config.json, "
                   "shipped config name, or Hugging Face Hub id already in the local cache "
                   "(default: the demo SmolLM2-135M-Instruct); never downloaded")
    g.add_argument("--tokenizer", default=None,
                   help="tokenizer directory, file or cached Hub id (default: the model's)")
    g.add_argument("--revision", default=None,
                   help="a Hub id's branch, tag or full commit id in the cache (default "
                   "main)")
    g.add_argument("--tokenizer-revision", default=None,
                   help="the same for a --tokenizer Hub id (default: --revision)")
    g.add_argument("--download-dir", default=None,
                   help="the Hugging Face cache folder Hub ids are read from (default: "
                   "huggingface_hub's, after HF_HOME / HF_HUB_CACHE); loom never downloads")
    g.add_argument("--code-revision", default=None,
                   help="accepted for vLLM compatibility and unused: loom runs no code "
                   "from a model's repository")
    g.add_argument("--dtype", default="auto", choices=[*DTYPES, *DTYPE_ALIASES])
    g.add_argument("--max-model-len", type=human_int, default=None,
                   help="tokens; as vLLM's, 32k is 32000 and 32K is 32768")
    g.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    g.add_argument("--kv-cache-memory-bytes", type=human_int, default=None,
                   help="bytes of KV cache instead of --gpu-memory-utilization's share "
                   "(8G is 8 GiB, 8g 8e9)")
    g.add_argument("--num-gpu-blocks-override", type=int, default=None,
                   help="this many KV-cache blocks, whatever the memory budget allowed "
                        "(vLLM's; on the CPU too)")
    g.add_argument("--prefix-caching-hash-algo", default="builtin",
                   choices=["builtin", "sha256", "sha256_cbor"],
                   help="the prefix cache's block hash: builtin (Python's, 64 bits) or sha256 "
                   "(collision-resistant: a crafted prompt cannot reach another's cached KV)")
    g.add_argument("--max-num-seqs", type=int, default=None,
                   help="default: 1024 on GPUs with at least 70 GiB (A100s excepted), "
                   "else 256; at most --max-num-batched-tokens")
    g.add_argument("--max-num-batched-tokens", type=human_int, default=None,
                   help="default: on GPUs with at least 70 GiB (A100s excepted) 16384 "
                   "offline and 8192 for `loom serve`; 8192 and 2048 on other GPUs; 8192 "
                   "on the CPU; at least --max-num-seqs")
    g.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=True,
                   help="overlap scheduling and input preparation of the next step with "
                   "the device's current one")
    g.add_argument("--kv-headroom-tokens", type=int, default=512,
                   help="admit a request only while the KV cache can also hold up to this "
                   "many more tokens for each running one (its max_tokens permitting), so "
                   "that decodes are not preempted and recomputed; 0: admit while the "
                   "prompt fits, as vLLM")
    g.add_argument("--scheduling-policy", default="fcfs", choices=SCHEDULING_POLICIES,
                   help="fcfs: requests are served in arrival order; priority: by each "
                   "request's priority (lower first), then arrival, and a lower-priority "
                   "running request is preempted when KV blocks run out")
    g.add_argument("--block-size", type=int, default=16)
    g.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True)
    g.add_argument("--kv-cache-dtype", default="auto", choices=KV_CACHE_DTYPES,
                   help="the KV cache's element type: auto (the model's dtype), or fp8 "
                   "(= fp8_e4m3) / fp8_e5m2, unscaled: half the cache's bytes")
    g.add_argument("--enforce-eager", action="store_true",
                   help="no torch.compile and no CUDA graphs, whatever -O says")
    g.add_argument("--load-format", default="auto", choices=LOAD_FORMATS)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--device", default="auto", choices=DEVICES)
    g.add_argument("-tp", "--tensor-parallel-size", type=int, default=1)
    g.add_argument("-O", "--compilation-config", default=None,
                   help="JSON object (or a bare level 0-3) for CompilationConfig; "
                   "\"mode\" is accepted for \"level\", as in current vLLM. As in vLLM, "
                   "also one key at a time (-O.cudagraph_mode=NONE, "
                   "-O.pass_config.enable_async_tp true), list items with + "
                   "(-O.compile_sizes+ 8), and -cc for -O; all of them merge")
    g.add_argument("--cudagraph-capture-sizes", type=int, nargs="+", default=None,
                   metavar="N", help="vLLM's: compilation_config.cudagraph_capture_sizes (the "
                   "decode batch sizes captured as CUDA graphs)")
    g.add_argument("--max-cudagraph-capture-size", type=int, default=None, metavar="N",
                   help="vLLM's: compilation_config.max_cudagraph_capture_size (the default "
                   "capture sizes stop at N)")
    g.add_argument("--cuda-graph-sizes", type=int, nargs="+", default=None, metavar="N",
                   help="vLLM 0.10's spelling: one N is --max-cudagraph-capture-size N, "
                   "several are --cudagraph-capture-sizes")
    g.add_argument("--worker-extension-cls", default="", metavar="MODULE.CLASS",
                   help="a class whose methods join every worker's, callable by name through "
                   "/collective_rpc (LOOM_SERVER_DEV_MODE=1) or LLM.collective_rpc")
    g.add_argument("--config-format", default="auto", choices=["auto", "hf", "mistral"],
                   help="auto and hf: the model's config.json (what loom reads); mistral's "
                   "params.json is refused")
    g.add_argument("--logits-processors", nargs="+", default=None, metavar="MODULE:CLASS",
                   help="custom logits processor classes (loom.logits_processor's interface, "
                   "vLLM's), each module.path:ClassName; a request turns one on through "
                   "vllm_xargs (SamplingParams.extra_args)")
    g.add_argument("--enable-sleep-mode", action="store_true",
                   help="weights and KV cache in memory that /sleep (LOOM_SERVER_DEV_MODE=1) "
                   "or LLM.sleep() frees and wake_up maps again at the same addresses")
    g.add_argument("--disable-cascade-attn", action="store_true",
                   help="accepted for vLLM compatibility: loom has no cascade attention")
    g.add_argument("--use-tqdm-on-load", action=argparse.BooleanOptionalAction, default=True,
                   help="accepted for vLLM compatibility: loom always shows its loading bar")
    g.add_argument("--max-parallel-loading-workers", type=int, default=None, metavar="N",
                   help="accepted for vLLM compatibility and unused: loom loads each rank's "
                   "shards in one pass")
    g.add_argument("--max-seq-len-to-capture", type=int, default=None, metavar="N",
                   help="accepted for vLLM compatibility (removed from vLLM) and unused: "
                   "loom's decode graphs take every context length")
    g.add_argument("--trust-remote-code", action="store_true", help=TRUST_REMOTE_CODE_HELP)
    g.add_argument("--swap-space", type=float, default=None, help=SWAP_SPACE_HELP)
    g.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction,
                   default=True, help=CHUNKED_PREFILL_HELP)
    g.add_argument("--generation-config", default="auto",
                   help="where the defaults of the sampling fields a request leaves unset "
                   "come from: auto (the model directory's generation_config.json), vllm "
                   "(none: loom's own defaults), or a directory whose "
                   "generation_config.json is read instead (its EOS ids too)")
    g.add_argument("--max-logprobs", type=int, default=20,
                   help="the most top logprobs a request may ask for at each position "
                   "(logprobs, top_logprobs, prompt logprobs); -1: the whole vocabulary")
    g.add_argument("--logprobs-mode", default="raw_logprobs", choices=LOGPROBS_MODES,
                   help="what logprobs hold: the model's raw logprobs (default) or logits, "
                   "or processed ones, after the sampler's penalties, temperature, "
                   "top-k/top-p and masks (prompt logprobs stay raw)")
    g.add_argument("-q", "--quantization", default=None,
                   help="fp8: quantize the weights to fp8 at load (W8A8, a scale per output "
                   "channel, activations per token); fp8 or compressed-tensors: the "
                   "checkpoint's own fp8 quantization_config (read without this flag "
                   "too); awq, gptq (or awq_marlin, gptq_marlin) or compressed-tensors: the "
                   "checkpoint's int4 or int8 weights (W4A16, W8A16, or W8A8 int8); "
                   "experts_int8: an MoE model's experts rounded to int8 at load (W8A16), "
                   "the rest unquantized")
    g.add_argument("--speculative-config", default=None,
                   help="JSON object for speculative decoding, as vLLM's: "
                   "'{\"method\": \"ngram\", \"num_speculative_tokens\": 4, "
                   "\"prompt_lookup_max\": 4}' (n-gram prompt lookup only)")
    g.add_argument("--enable-lora", action="store_true",
                   help="let requests name LoRA adapters (PEFT directories)")
    g.add_argument("--max-loras", type=int, default=1,
                   help="different adapters one step may use (device slots)")
    g.add_argument("--max-lora-rank", type=int, default=16,
                   help="the largest adapter rank accepted")
    g.add_argument("--max-cpu-loras", type=int, default=None,
                   help="adapters kept loaded in host memory (default: --max-loras)")
    g.add_argument("--lora-dtype", default="auto", choices=LORA_DTYPES,
                   help="the adapters' dtype: auto (the model's), or the model's own by name; "
                   "loom's LoRA layers compute in the model's dtype")
    g.add_argument("--hf-config-path", default=None, metavar="PATH",
                   help="a config.json (or a directory holding one) read in place of the "
                   "model's; the weights stay the model's")
    g.add_argument("--ignore-patterns", nargs="+", default=["original/**/*"], metavar="GLOB",
                   help="weight files (paths under the model directory) never read "
                   "(default: original/**/*)")
    g.add_argument("--disable-sliding-window", action="store_true",
                   help="a sliding-window model runs sequences no longer than its window "
                   "(its max model length becomes the window's), as vLLM's")
    g.add_argument("--safetensors-load-strategy", default="lazy", choices=("lazy", "eager"),
                   help="lazy: tensors read from the mapped file as they load; eager: each "
                   "file read whole first (network filesystems)")
    _add_vllm_model_flags(g)
    for flags, reason in REFUSED.items():
        g.add_argument(*flags.split(), action=_Refused, reason=reason)


def _add_vllm_model_flags(g) -> None:
    """vLLM's flags for the model's config and tokenizer, and for parallelism loom has not."""
    g.add_argument("--guided-decoding-backend", default=None, metavar="NAME",
                   help="vLLM's (auto, guidance, xgrammar, outlines, lm-format-enforcer, with "
                   ":options): accepted; loom's structured outputs always run on llguidance")
    g.add_argument("--structured-outputs-config", default=None, metavar="JSON",
                   help="vLLM's (backend, disable_fallback, disable_any_whitespace, "
                   "disable_additional_properties): accepted; llguidance runs every backend's "
                   "requests, compact and closed to undeclared keys")
    g.add_argument("--hf-overrides", default=None, metavar="JSON",
                   help="JSON object set over the model's config.json before loom reads it, "
                   "as vLLM's (e.g. '{\"rope_theta\": 1000000}')")
    g.add_argument("--pooler-config", "--override-pooler-config", default=None,
                   metavar="JSON", dest="pooler_config",
                   help="JSON object of pooling defaults, as vLLM's: pooling_type (CLS, LAST, "
                   "MEAN), normalize, dimensions, use_activation")
    g.add_argument("--override-generation-config", default=None, metavar="JSON",
                   help="JSON object of generation_config.json keys set over its sampling "
                   "defaults (e.g. '{\"temperature\": 0.5}'), as vLLM's")
    g.add_argument("--tokenizer-mode", default="auto",
                   help="auto or hf (same here: tokenizer.json, read with the `tokenizers` "
                   "library); slow, mistral and custom are refused")
    g.add_argument("-pp", "--pipeline-parallel-size", type=int, default=1,
                   help="1 only: loom has no pipeline parallelism (use -tp)")
    g.add_argument("-dp", "--data-parallel-size", type=int, default=1,
                   help="loom serve: run this many engine cores, each a whole replica of "
                   "the model on its own -tp devices, and spread requests over them")
    g.add_argument("--runner", default="auto", choices=RUNNERS,
                   help="generate, or pooling (embeddings, classification and scoring: "
                   "nothing is generated); auto: pooling for *ForSequenceClassification "
                   "models, else generate (a causal LM then embeds too)")
    g.add_argument("--convert", default="auto", choices=CONVERTS,
                   help="embed: serve a causal LM as an embedding model (pooling only); "
                   "classify: the model must be a *ForSequenceClassification checkpoint")
    g.add_argument("--task", default=None, choices=list(TASK_FLAG),
                   help="vLLM's deprecated flag: generate is --runner generate, embed "
                   "--runner pooling --convert embed, classify and score --runner pooling "
                   "--convert classify")
    g.add_argument("--distributed-executor-backend", default=None,
                   help="mp (a worker process per rank) or uni (one rank, in the engine core); "
                   "default: uni for one rank, mp for more; ray is refused")
    g.add_argument("--disable-custom-all-reduce", action="store_true",
                   help="every TP all-reduce through NCCL, never loom's kernels over "
                   "symmetric memory (vLLM's; for hosts whose GPUs cannot reach each other's "
                   "memory)")


_MM = "loom serves text-only models (no multimodal inputs)"
_DP_HOSTS = "loom's -dp runs every replica on this host"
_LORA = "loom's LoRA layers take rank-r A and B over the base weights only"
REFUSED = {
    "--enable-expert-parallel --enable-eplb": "loom shards MoE experts by tensor parallelism "
    "(-tp) only",
    "--cpu-offload-gb": "loom keeps every weight on the device",
    "--limit-mm-per-prompt --mm-processor-kwargs --disable-mm-preprocessor-cache "
    "--mm-encoder-tp-mode": _MM,
    "--kv-transfer-config --kv-events-config": "loom has no KV transfer between instances "
    "(disaggregated prefill)",
    "--headless --data-parallel-address --data-parallel-rpc-port --data-parallel-size-local "
    "--data-parallel-start-rank": _DP_HOSTS,
    "--attention-backend": "loom picks its attention kernels itself (Triton on CUDA, "
    "torch-native on the CPU)",
    "--enable-dbo": "loom has no dual-batch overlap",
    "--num-scheduler-steps": "vLLM V0's multi-step scheduling; loom's --async-scheduling "
    "overlaps each step's scheduling with the device instead",
    "--preemption-mode": "loom preempts by recomputing only, as vLLM's V1 engine",
    "--enable-lora-bias --fully-sharded-loras --lora-extra-vocab-size": _LORA,
    "--model-impl": "loom runs its own model implementations only",
    "--calculate-kv-scales": "loom's fp8 KV cache is unscaled (k_scale = v_scale = 1.0)",
    "--tokenizer-pool-size --tokenizer-pool-type": "removed from vLLM; loom tokenizes in "
    "its API server processes (--api-server-count)",
    "--max-num-partial-prefills --max-long-partial-prefills --long-prefill-token-threshold":
    "not implemented by loom: each step serves running requests first (a decode, or a "
    "prompt's next chunk), then admits waiting ones in queue order while tokens last",
    "--tokens-only": "loom has no tokens-in, tokens-out /inference/v1/generate route (vLLM's "
    "disaggregated serving); /v1/completions takes token-id prompts",
    "--gdn-prefill-backend": "loom runs no gated delta net (Qwen3-Next) models",
    "--kv-sharing-fast-prefill": "loom has no cross-layer KV sharing",
    "--collect-detailed-traces": "loom's spans are one llm_request span per request "
    "(--otlp-traces-endpoint), without model or worker detail",
    "--speculative-model --num-speculative-tokens": "vLLM's former spelling; use "
    "--speculative-config '{\"model\": ..., \"num_speculative_tokens\": k}'",
}
"""vLLM flags loom does not implement, each refused with its reason instead of argparse's
"unrecognized arguments"."""


class _Refused(argparse.Action):
    def __init__(self, option_strings, dest, reason: str, **kwargs) -> None:
        super().__init__(option_strings, dest=argparse.SUPPRESS, nargs="?",
                         default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        self.reason = reason

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        parser.error(f"{option_string}: {self.reason}")
