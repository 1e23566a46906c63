"""The tiny CPU runs' toy tasks (``data``: a copy task for verl's stock trainer, a needle-in-a-haystack task for the
memory agent's tiny run) and their dense rewards (``reward``), used by scripts/train_tiny_cpu.sh."""
