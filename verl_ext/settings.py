"""The ``recurrent:`` section of a run config, parsed once into one typed, checked object.

``configs/recurrent_trainer.yaml`` declares the section with the paper's defaults; an agent's own config file
(``configs/memory_agent.yaml``, ``configs/calculator_cpu.yaml``) names the agent and sets its settings. Everything in
``verl_ext`` reads the section through :func:`recurrent_settings`, never key by key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from recurrent.agent_thread import deadline_seconds
from verl_ext.trajectory_deadline import KEY as TRAJECTORY_TIMEOUT_KEY
from verl_ext.trajectory_deadline import TRAJECTORY_DEADLINE_S

ROLLOUT_MODES = ("async", "sync")
# Optimizer updates per step (verl_ext/minibatch.py, docs/fidelity.md "Mini-batches").
MINIBATCH_MODES = ("trajectory", "turn_major", "rows")
# What the preflight does when actor_rollout_ref.rollout.n == 1 (GRPO without a group): verl_ext/preflight.py.
SINGLE_TRAJECTORY = ("warn", "refuse")
# recurrent.credit (docs/fidelity.md "Credit on every turn"). verl 0.9.1 masks the policy-gradient and KL terms
# with `response_mask` (workers/utils/losses.py ppo_loss) but divides the token-mean loss of an update by the sum of
# `loss_mask` over all its rows and ranks (the FSDP engine's forward_backward_batch: `batch_num_tokens`); its
# rollout stores loss_mask = response_mask (trainer/ppo/v1/agent_loop_tq.py).
CREDIT_MODES = (
    "all",  # the paper: the answer's advantage on every call; each update divided by all its rows' tokens
    "final_same_step",  # earlier calls: zero advantage and response_mask, loss_mask kept: the answer calls' loss is
    # still divided by every row's tokens, so the answers take exactly the step they take under `all`
    "final_token_mean",  # loss_mask zeroed too: the answers' loss divided by the answer tokens of the update alone
)


@dataclass(frozen=True)
class RecurrentSettings:
    """What the ``recurrent:`` section says: the agent and its settings, and how verl trains it."""

    agent: str = ""  # a registered agent's name, a module path or a file path
    agent_config: dict[str, Any] = field(default_factory=dict)  # the agent's settings (its config class's fields)
    mode: str = "async"  # async: one coroutine per trajectory; sync: lockstep rounds (session agents only)
    minibatch: str = "trajectory"
    credit: str = "all"
    replay_poll_interval_s: float | None = None  # None keeps verl's 2.0 s
    single_trajectory: str = "warn"  # rollout.n == 1 with GRPO: warn, or refuse (exit 2)
    # The rollout dump also holds every row's prompt and response token ids (python -m verl_ext.rows shows
    # them);
    # off by default: at the paper's scale they would triple a dump of ~7K-token rows.
    dump_token_ids: bool = False
    # Seconds a trajectory's agent may run, whatever it does; past it the trajectory fails
    # (verl_ext/trajectory_deadline.py, where the default's reason is). None: no limit.
    trajectory_timeout_s: float | None = TRAJECTORY_DEADLINE_S
    # The reward function's extra_info holds every call's messages and reply and the sample (verl_ext/
    # agent_loop_manager.py); off for the memory agent, whose calls hold its whole document.
    reward_trajectory: bool = True
    # The preflight runs one episode of the agent against a scripted model before the launch
    # (verl_ext/agent_probe.py); off for an agent that cannot end an episode on the scripted reply.
    preflight_episode: bool = True

    def __post_init__(self) -> None:
        if self.mode not in ROLLOUT_MODES:
            raise ValueError(f"recurrent.mode must be one of {ROLLOUT_MODES}, got {self.mode!r}")
        if self.minibatch not in MINIBATCH_MODES:
            raise ValueError(f"recurrent.minibatch must be one of {MINIBATCH_MODES}, got {self.minibatch!r}")
        if self.credit == "final":  # the switch's name before the two ablations were told apart
            raise ValueError(
                "recurrent.credit=final is now two switches: final_same_step (what `final` did: the answer turns "
                "keep the step they take with credit on every turn) or final_token_mean (the answers' loss averaged "
                "over their own tokens); docs/fidelity.md, 'Credit on every turn'"
            )
        if self.credit not in CREDIT_MODES:
            raise ValueError(f"recurrent.credit must be one of {CREDIT_MODES}, got {self.credit!r}")
        if self.credit == "final_token_mean" and self.minibatch != "trajectory":
            # an update of earlier calls only (possible unless updates hold whole trajectories) would divide 0 by 0
            raise ValueError(
                f"recurrent.credit=final_token_mean needs recurrent.minibatch=trajectory (got {self.minibatch!r}): "
                "it divides each update's loss by the update's answer tokens, and an update without an answer row "
                "would have none"
            )
        if self.single_trajectory not in SINGLE_TRAJECTORY:
            choices = ", ".join(SINGLE_TRAJECTORY)
            raise ValueError(f"recurrent.single_trajectory must be one of {choices}, got {self.single_trajectory!r}")
        if self.replay_poll_interval_s is not None and not self.replay_poll_interval_s > 0:
            raise ValueError(f"recurrent.replay_poll_interval_s must be positive, got {self.replay_poll_interval_s}")
        deadline_seconds(self.trajectory_timeout_s, TRAJECTORY_TIMEOUT_KEY)  # a ValueError naming the key


KNOWN_KEYS = {
    "agent",
    "config",
    "mode",
    "minibatch",
    "credit",
    "replay_poll_interval_s",
    "manager_class",
    "single_trajectory",
    "dump_token_ids",
    "trajectory_timeout_s",
    "reward_trajectory",
    "preflight_episode",
}


def recurrent_settings(config: DictConfig | Any) -> RecurrentSettings:
    """The checked :class:`RecurrentSettings` of a run config (its ``recurrent:`` section)."""
    section = config.get("recurrent") if hasattr(config, "get") else getattr(config, "recurrent", None)
    if section is None:
        raise ValueError("the config has no recurrent: section (compose on configs/recurrent_trainer.yaml)")
    values = OmegaConf.to_container(section, resolve=True) if isinstance(section, DictConfig) else dict(section)
    unknown = sorted(set(values) - KNOWN_KEYS)
    if unknown:
        raise ValueError(f"recurrent: has no key {', '.join(map(repr, unknown))}; its keys: {sorted(KNOWN_KEYS)}")
    poll = values.get("replay_poll_interval_s")
    timeout = values.get("trajectory_timeout_s", TRAJECTORY_DEADLINE_S)
    return RecurrentSettings(
        agent=str(values.get("agent") or ""),
        agent_config=dict(values.get("config") or {}),
        mode=str(values.get("mode", "async")),
        minibatch=str(values.get("minibatch", "trajectory")),
        credit=str(values.get("credit", "all")),
        replay_poll_interval_s=None if poll is None else float(poll),
        single_trajectory=str(values.get("single_trajectory", "warn")),
        dump_token_ids=bool(values.get("dump_token_ids", False)),
        trajectory_timeout_s=deadline_seconds(timeout, TRAJECTORY_TIMEOUT_KEY),
        reward_trajectory=bool(values.get("reward_trajectory", True)),
        preflight_episode=bool(values.get("preflight_episode", True)),
    )


def resolve_agent_file(config: DictConfig, cwd: Path | None = None) -> str | None:
    """Make an agent file named in ``recurrent.agent`` absolute, in ``config`` itself, and return it (None: the
    agent is a registered name or a module). A relative path is read from ``cwd``, the working directory of the
    command by default, wherever the config file lies (docs/write_your_own_agent.md): the trainer's Ray workers
    build the agent wherever they run, so they get the absolute path. A missing file raises
    ``FileNotFoundError`` naming the path it was looked for at."""
    from recurrent.interface import is_agent_file

    agent = recurrent_settings(config).agent
    if not agent or not is_agent_file(agent):
        return None
    target, sep, obj = agent.partition(":")
    base = cwd or Path.cwd()
    path = Path(target).expanduser()
    path = path if path.is_absolute() else base / path
    if not path.is_file():
        where = (
            ""
            if Path(target).expanduser().is_absolute()
            else f" (a relative path is read from the working directory, {base})"
        )
        raise FileNotFoundError(f"recurrent.agent={agent}: no agent file at {path}{where}")
    resolved = f"{path.resolve()}{sep}{obj}"
    config.recurrent.agent = resolved
    return resolved
