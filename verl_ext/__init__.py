"""Everything that plugs MemAgent into stock verl 0.9.1: agent loop, reward, trainer, plugin entry point."""
