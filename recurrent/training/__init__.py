"""Everything that plugs the agent framework into stock verl 0.9.1: agent loop, reward, trainer, plugin entry point.
Generic over agents: the agent to train is the one the ``recurrent:`` section names (``settings``).

- ``settings``: the ``recurrent:`` section, parsed once;
- ``rollout``: the glue from an agent's episode to verl rows (row widths, server calls, one output per call);
- ``agent_loop``: async mode, the ``recurrent_agent`` loop in verl's registry; ``lockstep``: sync mode, the
  trajectories of a batch through ``recurrent.lockstep`` (session agents);
- ``agent_loop_manager``: verl's V1 agent-loop manager/worker of each mode (``recurrent.mode`` picks the class);
- ``reward``: the strict verifier as verl's custom reward function;
- ``metrics``, ``trainer``: per-trajectory metrics, ``RecurrentPPOTrainer`` and its task runner;
- ``preflight``, ``main``: checks before Ray starts, the Hydra entry ``python -m recurrent.training.main``;
- ``rows``: ``python -m recurrent.training.rows``, the token ids of a run's rows from its rollout dump;
- ``plugin``: the ``verl.plugins`` entry point; ``cpu``: CPU execution pieces (a token server for now);
- ``attention``: flash-attn or sdpa, by what is installed (the configs' two resolvers, registered here).
"""

from recurrent.training.attention import register_resolvers

register_resolvers()
