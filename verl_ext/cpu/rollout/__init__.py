"""Adaptation 5: a Hugging Face transformers rollout for CPU, registered as ``hf_cpu``.

verl 0.9.1 only ships vLLM/SGLang/TRT-LLM rollouts (``workers/rollout/replica.py:388-390``,
``workers/rollout/base.py:89-93``), none of which runs on a CPU-only machine. Three pieces:

- :mod:`.server`: ``HFCPUServer``, the token-in/token-out server (a Ray actor per replica);
- :mod:`.replica`: ``HFCPUReplica(RolloutReplica)``, which launches it (``RolloutReplicaRegistry``);
- :mod:`.adapter`: ``HFCPUServerAdapter(BaseRollout)``, the trainer-side end of the weight sync, in each
  FSDP worker (``_ROLLOUT_REGISTRY[("hf_cpu", "async")]``).

Select it with ``actor_rollout_ref.rollout.name=hf_cpu`` (``mode=async`` is the only mode).
"""

ROLLOUT_NAME = "hf_cpu"
SERVER_ADDRESS_SCHEME = "hfcpu://"


def server_actor_name(replica_rank: int, kind: str = "", suffix: str = "") -> str:
    """The Ray actor name of a replica's server (one server per replica); the adapter finds it by name.

    ``kind`` is "" for the policy, ``reward``/``teacher`` for model-based reward / distillation replicas;
    ``suffix`` is the replica's ``name_suffix`` (already starting with ``_`` when set)."""
    middle = f"{kind}_" if kind else ""
    return f"hf_cpu_server_{middle}{replica_rank}{suffix}"
