"""Tasks and data: verifiers, dataset synthesis (memory_data) and the evaluation harness (memory_eval)."""
