"""MemAgent's task tools: the verifiers shared by training rewards and evaluation (``verifiers``), the paper's
datasets (``memory_data``), the evaluation harness (``memory_eval``) and the OpenAI-compatible endpoint over an agent
(``endpoint``)."""
