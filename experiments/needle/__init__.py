"""A CPU-scale replication of MemAgent's needle-in-a-haystack result (docs/replication_cpu.md).

- :mod:`experiments.needle.needle`: the needle task, with train / validation / test splits that share no
  needle, written as verl parquet rows and eval-set JSON lines.
- :mod:`experiments.needle.reader`: the reader's tokenizer (byte-level BPE trained on the task's text,
  numbers as two-digit tokens) and its ~1M-parameter Qwen2 configuration.
- :mod:`experiments.needle.warm_start`: the supervised warm start (copy curriculum, then naive-teacher
  transcripts, each stage to a step budget), cached in the offline model cache, and its measurement with the
  real memory agent.
"""
