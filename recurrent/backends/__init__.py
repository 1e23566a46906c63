"""Generation backends with verl's rollout-worker shape: ``generate_sequences(DataProto) -> DataProto``."""
