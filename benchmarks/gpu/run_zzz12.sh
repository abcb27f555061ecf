# 1 GPU (~3 min for two sweeps), session 19. Served TTFT at 10 QPS (8B dummy, 550 -> 150;
# issue 7's goal <= 40 ms) with mixed steps in one attention launch below 16 decodes
# (eb77510; run_zzz10 in-process: prompt step 17.7 / 17.5 against 23.1 / 23.2 ms median)
# against the former default (every mixed step split, LOOM_MIXED_SPLIT_MIN_DECODES=1).
# The sweep and flags of run_zzz8; the server inherits the environment.
# Arguments: the sweeps in order (default: split16 split1), split1 and split1-* run with the
# former default; RUN names the result folder (default zzz12; run_zzz13.sh sets zzz13).
source benchmarks/gpu/env.sh
R=$OUT/${RUN:-zzz12}; mkdir -p $R
O='{"level":3,"cudagraph_capture_sizes":[1,2,4,8,16,24,32,40,48,56,64]}'
deadline=0
[ $# -eq 0 ] && set -- split16 split1
for name in "$@"; do
  deadline=$((deadline + 175))
  case $name in split1|split1-*) split=1 ;; *) split=16 ;; esac
  LOOM_MIXED_SPLIT_MIN_DECODES=$split timeout $(left $deadline) $LOOM bench sweep --model llama-3.1-8b \
    --rates 10 --modes multiprocess --duration 30 --ignore-eos --dataset-name random \
    --random-input-len 550 --random-output-len 150 --result-dir $R/$name \
    -- --load-format dummy --max-model-len 2048 -O "$O" > $R/$name.log 2>&1
  grep -E "server side|^ +10 \|" $R/$name.log
  grep -h "compiled while serving" $R/$name/server-*.log | cut -c1-160; stamp "$name"
done
find $R -name "server-multiprocess.log" -size +2M -delete
tar czf $OUT/$(basename $R).tgz -C $R . ; stamp done
