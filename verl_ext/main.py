"""Train an agent on stock verl: ``python -m verl_ext.main --config-name memagent_7b [overrides]`` (MemAgent
7B, the
default; any run config of ``configs/`` names its agent in ``recurrent.agent``).

Hydra entry over ``configs/`` (``--cfg job`` prints the composed config and exits without running).
The run: checks on this machine first (:mod:`verl_ext.preflight`: data files and columns, the model folder,
the agent and its widest call against verl's rows), the config resolved here (so ``${oc.env:...}`` means this
machine's environment, also on a remote Ray cluster), verl's own config validation, then verl's ``run_ppo`` with
our task runner
(:class:`verl_ext.trainer.RecurrentTaskRunner`: the V1 sync trainer plus final-answer metrics). With
``RAY_ADDRESS`` (or ``ray_kwargs.ray_init.address``) it joins that Ray cluster instead of starting one, and a node of
the run lost mid-run stops it with a message (:mod:`verl_ext.node_watch`, exit status 75).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from verl_ext.run_config import CONFIG_DIR


def run(config: DictConfig) -> None:
    from verl_ext.preflight import PreflightError
    from verl_ext.settings import resolve_agent_file

    try:
        resolve_agent_file(config)  # a relative agent file is the caller's: the workers get its absolute path
    except FileNotFoundError as err:
        raise PreflightError(str(err)) from err
    # verl and Ray are imported here, not at module level: `--cfg job` and --help stay fast.
    from verl.trainer.main_ppo import run_ppo
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config
    from verl.utils.device import auto_set_device

    from recurrent.sampling import describe_rule
    from verl_ext import engine_watch
    from verl_ext.cluster import cluster_address, drop_local_ray_settings
    from verl_ext.node_watch import LOSS_CONFIRM_S, NodeWatch, exit_on_node_lost
    from verl_ext.preflight import preflight
    from verl_ext.trainer import RecurrentTaskRunner

    if config.trainer.device == "cpu" and os.environ.get("VERL_PLATFORM") != "cpu":
        # Without the CPU platform verl falls back to CUDA (auto_set_device would switch the run to cuda).
        raise PreflightError(
            "trainer.device=cpu needs the CPU platform in every process: run scripts/train_tiny_cpu.sh, or set "
            "VERL_PLATFORM=cpu VERL_USE_EXTERNAL_MODULES=verl_ext.cpu.load "
            "(see verl_ext/cpu/README.md)"
        )
    auto_set_device(config)
    preflight(config)
    rollout = config.actor_rollout_ref.rollout
    run_sampling = {"temperature": rollout.temperature, "top_p": rollout.top_p}
    print(f"[memagent] {describe_rule(run_sampling, 'actor_rollout_ref.rollout: the paper trains at 1.0 and 1.0')}")
    joined = cluster_address(config, os.environ)
    dropped = drop_local_ray_settings(config, os.environ)
    if dropped:
        keys = ", ".join(f"ray_kwargs.ray_init.{key}" for key in dropped)
        print(f"[memagent] joining the Ray cluster at {joined}: {keys} (the size of a Ray of its own) not used")
    OmegaConf.resolve(config)
    validate_config(config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    watch = NodeWatch(config.trainer.get("default_local_dir"), exit_on_node_lost).start()
    engines = engine_watch.start(config)  # a vLLM rollout engine that dies stops the run (verl_ext/engine_watch.py)
    from verl_ext.failures import TrajectoriesFailed

    try:
        run_ppo(config, task_runner_class=RecurrentTaskRunner)
    except (PreflightError, TrajectoriesFailed):
        raise
    except Exception:
        # A lost node may show first as an error from one of its actors or peers, before Ray declares the node dead
        # (missed health checks): on a run over several nodes, give the watch that long to name it.
        if len(watch.seen_alive) > 1:
            print(f"[memagent] the run failed; looking {LOSS_CONFIRM_S:.0f} s for a lost Ray node", file=sys.stderr)
            if watch.lost.wait(LOSS_CONFIRM_S):
                exit_on_node_lost(str(watch.message))
        raise
    finally:
        watch.stop()
        if engines is not None:
            engines.stop()


@hydra.main(config_path=str(CONFIG_DIR), config_name="memagent_7b", version_base=None)
def main(config: DictConfig) -> None:
    from verl_ext.preflight import PreflightError

    try:
        run(config)
    except PreflightError as err:  # a configuration problem, not a crash: the message says what to fix
        # Raised in the task runner (verl_ext.cluster), it arrives wrapped in Ray's RayTaskError, which is
        # also a PreflightError; its `cause` is the original, without the remote traceback.
        print(f"[memagent] {getattr(err, 'cause', None) or err}", file=sys.stderr)
        sys.exit(2)
    except Exception as err:
        from verl_ext.failures import TrajectoriesFailed

        if not isinstance(err, TrajectoriesFailed):
            raise
        # Every trajectory of a step failed: the agent's own first failure and the count, once (each failed
        # trajectory's traceback is in the agent-loop workers' log above).
        print(f"[memagent] {getattr(err, 'cause', None) or err}", file=sys.stderr)
        sys.exit(1)


def check_run_config(argv: list[str]) -> Path | None:
    """The run config named on the command line (``--config-name``, looked for in ``--config-dir`` then
    ``configs/``), checked before Hydra composes it (:func:`recurrent.options.check_yaml`): a YAML alias bomb is one
    line and exit 2, not a Hydra that grows until the machine runs out of memory. Returns its file, if found."""
    from recurrent.options import ConfigError, check_yaml

    given: dict[str, str] = {}
    names = {"-cn": "name", "--config-name": "name", "-cd": "dir", "--config-dir": "dir"}
    for k, arg in enumerate(argv):
        flag, eq, value = arg.partition("=")
        if flag in names:
            value = value if eq else argv[k + 1] if k + 1 < len(argv) else ""
            given[names[flag]] = value
    name = given.get("name", "memagent_7b")
    folders = [Path(given["dir"])] if "dir" in given else []
    for folder in [*folders, CONFIG_DIR]:
        path = folder / (name if name.endswith((".yaml", ".yml")) else f"{name}.yaml")
        if path.is_file():
            try:
                check_yaml(path)
            except ConfigError as err:
                print(f"[memagent] the run config cannot be read: {err}", file=sys.stderr)
                sys.exit(2)
            return path
    return None


def local_search_path_argv(argv: list[str]) -> list[str]:
    """``argv`` with the run config's declared ``hydra.searchpath`` given again, verl's configs by their folder
    (:func:`verl_ext.run_config.local_search_path`: composing then imports nothing of verl, so ``--cfg job`` and
    DRY_RUN answer in about a second). Unchanged when the caller sets the search path or the config declares
    none."""
    from verl_ext.run_config import declared_search_path, search_path_override, sets_search_path

    primary = check_run_config(argv)
    declared = declared_search_path(primary) if primary is not None else []
    if not declared or sets_search_path(argv):
        return argv
    # Beside the caller's overrides: Hydra's parser takes them as one run of positional arguments.
    at = first_override(argv)
    return [*argv[:at], search_path_override(declared), *argv[at:]]


HYDRA_OPTIONS_WITH_A_VALUE = {"-cp", "--config-path", "-cn", "--config-name", "-cd", "--config-dir", "-c", "--cfg"}
HYDRA_OPTIONS_WITH_A_VALUE |= {"-p", "--package", "-i", "--info", "--experimental-rerun"}


def first_override(argv: list[str]) -> int:
    """The index of the first Hydra override in ``argv`` (an argument that is no option nor an option's value), or
    ``len(argv)`` when there is none."""
    k = 0
    while k < len(argv):
        if not argv[k].startswith("-"):
            return k
        k += 2 if argv[k] in HYDRA_OPTIONS_WITH_A_VALUE else 1
    return len(argv)


def original_keys_argv(argv: list[str]) -> list[str]:
    """``argv`` with the original MemAgent's Hydra keys on ours (:mod:`verl_ext.original_keys`), a note printed for
    each one rewritten; one that has no counterpart here stops with one line and exit status 2."""
    from verl_ext.original_keys import OriginalKeyError, translate_overrides

    at = first_override(argv)
    try:
        overrides, notes = translate_overrides(argv[at:])
    except OriginalKeyError as err:
        print(f"[memagent] {err}", file=sys.stderr)
        sys.exit(2)
    for note in notes:
        print(f"[memagent] {note}", file=sys.stderr)
    return [*argv[:at], *overrides]


if __name__ == "__main__":
    sys.argv[1:] = local_search_path_argv(original_keys_argv(sys.argv[1:]))
    main()
