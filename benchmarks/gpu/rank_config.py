"""Writes the config of one TP=2 rank's shapes to the path given (default
/tmp/llama-8b-tp2-rank.json): Llama-3.1-8B's shipped config with 16 query and 4 KV heads,
intermediate 7168 and vocab 64128, so that every GEMM of a 1-GPU run is a rank's shard
and no collective runs (issue 4's decode budget on one GPU; run_zzz20 on)."""

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
config = json.loads((REPO / "loom/bench/configs/llama-3.1-8b.json").read_text())
config.update(num_attention_heads=16, num_key_value_heads=4, head_dim=128,
              intermediate_size=7168, vocab_size=64128)
out = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/llama-8b-tp2-rank.json")
out.write_text(json.dumps(config, indent=1))
