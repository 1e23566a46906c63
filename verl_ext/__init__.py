"""The framework's verl glue: training any agent of ``recurrent`` on stock verl 0.9.1, through verl's registries, config
composition and subclassing. It names no agent: the agent to train is the one the ``recurrent:`` section names.

- ``settings``: the ``recurrent:`` section, parsed once;
- ``rollout``: from an agent's episode to verl rows (row widths, server calls, one row per call);
- ``agent_loop``: async mode, the ``recurrent_agent`` loop in verl's registry; ``sync_rollout``: sync mode, the
  trajectories of a batch through ``recurrent.generation_manager``;
- ``agent_loop_manager``: verl's V1 agent-loop manager/worker of each mode (``recurrent.mode`` picks the class);
- ``trainer``: ``RecurrentPPOTrainer`` and its task runner (where the final reward becomes every turn's advantage:
  ``credit``); ``minibatch``: whole trajectories per update; ``metrics``: per-trajectory metrics;
- ``preflight``, ``main``: checks before Ray starts, the Hydra entry ``python -m verl_ext.main``;
- ``cluster``, ``node_watch``: the checks of a Ray cluster before the first step, a lost node mid-run;
- ``plan``, ``cost``, ``cost_report``, ``cost_calibration``: what a step means and costs;
- ``rows``: ``python -m verl_ext.rows``, the token ids of a run's rows from its rollout dump;
- ``plugin``: the ``verl.plugins`` entry point; ``cpu``: the CPU twin of the GPU pieces (platform, engines, rollout);
- ``attention``: flash-attn or sdpa, by what is installed (the configs' two resolvers, registered here).
"""

from verl_ext.attention import register_resolvers

register_resolvers()
