"""CPU-scale experiments that show the framework's claims on a 2-core machine: the MemAgent replication (``needle``:
a ~1M reader warm-started, trained by RL and evaluated far past its training lengths; docs/replication_cpu.md), the tool-using
arithmetic agent trained by RL (``calculator``; docs/calculator_cpu.md), the tiny runs' toy tasks (``tiny``), and what
the two small readers share (``small_reader``, ``sft``)."""
