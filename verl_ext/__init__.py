"""Everything that plugs MemAgent into stock verl 0.9.1: agent loop, reward, trainer, plugin entry point.

- ``rollout``: the glue from a ``recurrent`` session to verl rows (budgets, server calls, one output per turn);
- ``agent_loop``: async mode, the ``memory_agent`` loop in verl's registry; ``lockstep``: sync mode, the
  trajectories of a batch through ``recurrent.lockstep``;
- ``agent_loop_manager``: verl's V1 agent-loop manager/worker of each mode (``recurrent.mode`` picks the class);
- ``reward``: the strict verifier as verl's custom reward function;
- ``metrics``, ``trainer``: final-answer metrics, ``RecurrentPPOTrainer`` and its task runner;
- ``preflight``, ``main``: checks before Ray starts, the Hydra entry ``python -m verl_ext.main``;
- ``plugin``: the ``verl.plugins`` entry point; ``cpu``: CPU execution pieces (a token server for now);
- ``attention``: flash-attn or sdpa, by what is installed (the configs' two resolvers, registered here).
"""

from verl_ext.attention import register_resolvers

register_resolvers()
