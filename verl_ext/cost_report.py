"""The inputs of the step cost model from a composed config, the data and the command line, and its printed table.

``python -m verl_ext.plan`` prints it (docs/cluster.md, "What a step costs"). Every input says where it came
from:
the model's shape (its local ``config.json``, else the published sizes), the trajectories' calls (the agent's
``step_shapes``, which names its own sources: the training parquet's rows of the step or assumed lengths,
generated lengths given or the caps), the cluster (GPU kind and count, utilisation assumed).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from recurrent.flops import PUBLISHED_SHAPES, ModelShape
from recurrent.interface import WorkflowConfig, WorkflowRegistration, load_register
from recurrent.step_shapes import CallShape, StepShapes, StepShapesRequest
from verl_ext.cost import DEVICES, PHASES, TRAINING_PHASES, Cluster, StepCost

GPU_UTILISATION = 0.4  # of dense peak, every phase: an assumption until measured (docs/cluster.md)
REPORTABLE = (*TRAINING_PHASES, "step")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("cost of a step (docs/cluster.md, 'What a step costs')")
    group.add_argument("--no-cost", dest="cost", action="store_false", help="print the step plan only")
    group.add_argument("--data", type=Path, help="training parquet (default: data.train_files when it exists)")
    group.add_argument("--step", type=int, default=1, help="which step's prompts, in file order (default 1)")
    group.add_argument("--tokenizer", help="tokenizer folder for --data (default: the model's, when local)")
    group.add_argument("--call-tokens", type=int, help="tokens generated per call before the answer (default: the cap)")
    group.add_argument("--answer-tokens", type=int, help="tokens generated per answer (default: the cap)")
    group.add_argument("--question-tokens", type=int, help="question length without a parquet (default: the agent's)")
    group.add_argument("--device", choices=sorted(DEVICES), help="default: cpu for trainer.device=cpu, else h100")
    group.add_argument("--devices", type=int, help="default: trainer.nnodes x trainer.n_gpus_per_node")
    group.add_argument(
        "--utilisation",
        action="append",
        default=[],
        metavar="[PHASE=]X",
        help=f"share of peak FLOP/s (GPU default {GPU_UTILISATION}; phases: {', '.join(PHASES)})",
    )
    group.add_argument("--bandwidth-efficiency", type=float, default=0.7, help="decode's share of memory bandwidth")
    group.add_argument(
        "--reported",
        action="append",
        default=[],
        metavar="PHASE=SECONDS",
        help=f"a measured time to set beside the model ({', '.join(REPORTABLE)}): the utilisation that reconciles it",
    )


def default_args(**values: Any) -> argparse.Namespace:
    """The command line's defaults (``--context-tokens`` is the plan's own option), with ``values`` set."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args([])
    args.context_tokens = None
    for name, value in values.items():
        if not hasattr(args, name):
            raise TypeError(f"no cost argument {name!r}")
        setattr(args, name, value)
    return args


def model_folder(config: DictConfig) -> str | None:
    """The model's local folder, or None where it is not on this machine."""
    from recurrent.models import ModelNotAvailableError, resolve_model_path

    try:
        return resolve_model_path(str(config.actor_rollout_ref.model.path))
    except ModelNotAvailableError:
        return None


def model_shape(config: DictConfig, folder: str | None) -> tuple[ModelShape, str]:
    path = str(config.actor_rollout_ref.model.path)
    if folder is not None and (Path(folder) / "config.json").is_file():
        return ModelShape.from_folder(folder), f"config.json of {folder}"
    if path in PUBLISHED_SHAPES:
        return PUBLISHED_SHAPES[path], "its published config; no local copy"
    raise ValueError(
        f"actor_rollout_ref.model.path={path}: no local config.json and no published shape known here "
        f"({', '.join(PUBLISHED_SHAPES)}); point it at a local model folder"
    )


def agent_cost_model(config: DictConfig) -> tuple[WorkflowRegistration, WorkflowConfig]:
    """The run's agent and its config, when its registration has a step cost model (``step_shapes``)."""
    from verl_ext.settings import recurrent_settings

    settings = recurrent_settings(config)
    if not settings.agent:
        raise ValueError("recurrent.agent is not set: no agent, no calls to count; --no-cost prints the step plan")
    register = load_register(settings.agent)
    if register.step_shapes is None:
        raise ValueError(
            f"agent {settings.agent!r} has no step cost model (step_shapes); --no-cost prints the step plan"
        )
    return register, register.make_config(settings.agent_config)


def train_file(config: DictConfig) -> Path | None:
    files = config.data.train_files
    files = [files] if isinstance(files, str) else list(files)
    return Path(files[0]) if len(files) == 1 and Path(files[0]).is_file() else None


def utilisation(values: Sequence[str], default: float) -> dict[str, float]:
    """``--utilisation 0.3 --utilisation update_actor=0.1``: a default, then per phase."""
    out = dict.fromkeys(PHASES, default)
    for value in values:
        phase, _, number = value.rpartition("=")
        if phase and phase not in PHASES:
            raise ValueError(f"--utilisation {value}: phase must be one of {', '.join(PHASES)}")
        try:
            share = float(number)
        except ValueError:
            raise ValueError(f"--utilisation {value}: {number!r} is not a number") from None
        if not 0 < share <= 1:
            raise ValueError(f"--utilisation {value}: a share of peak must be in (0, 1]")
        out.update({phase: share} if phase else dict.fromkeys(PHASES, share))
    return out


def reported_times(values: Sequence[str]) -> dict[str, float]:
    """``--reported update_actor=2100``: measured seconds by phase (or ``step``)."""
    out = {}
    for value in values:
        phase, _, number = value.partition("=")
        if phase not in REPORTABLE:
            raise ValueError(f"--reported {value}: PHASE=SECONDS, phase one of {', '.join(REPORTABLE)}")
        try:
            out[phase] = float(number)
        except ValueError:
            raise ValueError(f"--reported {value}: {number!r} is not a number of seconds") from None
        if out[phase] <= 0:
            raise ValueError(f"--reported {value}: seconds must be positive")
    return out


def cluster_from(config: DictConfig, args: argparse.Namespace) -> Cluster:
    kind = args.device or ("cpu" if str(config.trainer.get("device", "cuda")) == "cpu" else "h100")
    devices = args.devices or int(config.trainer.nnodes) * int(config.trainer.n_gpus_per_node)
    if devices < 1:
        raise ValueError(f"--devices {devices}: at least 1")
    default = 1.0 if kind == "cpu" else GPU_UTILISATION
    return Cluster(DEVICES[kind], devices, utilisation(args.utilisation, default), args.bandwidth_efficiency)


def check_arguments(args: argparse.Namespace) -> None:
    """The cost options that need no config, checked before the config is composed (about a second): a wrong
    ``--step``, ``--utilisation``, ``--reported``, ``--devices`` or ``--data`` stops at once, naming itself."""
    if args.step < 1:
        raise ValueError(f"--step {args.step}: steps count from 1")
    if args.devices is not None and args.devices < 1:
        raise ValueError(f"--devices {args.devices}: at least 1")
    utilisation(args.utilisation, GPU_UTILISATION)
    reported_times(args.reported)
    if args.data is not None and not args.data.is_file():
        raise ValueError(f"--data {args.data}: no such file")


class CostInputs:
    """Everything the model needs besides the config, each with where it came from. Cheap checks come first; the
    agent reads the data last."""

    def __init__(self, config: DictConfig, args: argparse.Namespace) -> None:
        register, agent_config = agent_cost_model(config)
        check_arguments(args)
        self.cluster = cluster_from(config, args)
        self.reported = reported_times(args.reported)
        folder = model_folder(config)
        self.shape, self.shape_source = model_shape(config, folder)
        prompts = int(config.data.train_batch_size)
        data = args.data or train_file(config)
        if data is not None and not data.is_file():
            raise ValueError(f"--data {data}: no such file")
        tokenizer_folder = args.tokenizer or folder
        tokenizer = None
        if tokenizer_folder is not None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(tokenizer_folder)
        request = StepShapesRequest(
            prompts=prompts,
            first=(args.step - 1) * prompts,
            data=data,
            context_tokens=args.context_tokens,
            question_tokens=args.question_tokens,
            call_tokens=args.call_tokens,
            answer_tokens=args.answer_tokens,
            tokenizer_source="the model's tokenizer"
            if args.tokenizer is None
            else f"the tokenizer of {args.tokenizer}",
        )
        self.shapes: StepShapes = register.step_shapes(agent_config, tokenizer, request)

    def trajectories(self) -> list[list[CallShape]]:
        return self.shapes.trajectories


def count(value: float) -> str:
    """12.3M, 45.6K, 789."""
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "K")):
        if value >= scale:
            return f"{value / scale:.4g}{suffix}"
    return f"{value:.0f}"


def report(config: DictConfig, inputs: CostInputs, cost: StepCost) -> list[str]:
    """The printed lines: where each input came from, then a row per phase."""
    shape, cluster = inputs.shape, inputs.cluster
    packed = bool(config.actor_rollout_ref.model.use_remove_padding)
    attention = "flash-attn on packed rows" if packed else "sdpa on padded rows (use_remove_padding=false)"
    share = ", ".join(f"{p} {u:g}" for p, u in cluster.utilisation.items())
    lines = [
        "cost of one step (docs/cluster.md, 'What a step costs'):",
        f"{'model':>20}: {shape.name}, {shape.parameters / 1e9:.3g}B parameters ({inputs.shape_source})",
        *(f"{what:>20}: {source}" for what, source in inputs.shapes.sources),
        f"{'attention':>20}: {attention}",
        f"{'cluster':>20}: {cluster.devices} x {cluster.device.name}",
        f"{'utilisation':>20}: {share} ("
        + ("of the calibrated rate" if cluster.device.calibrated else "assumed")
        + f"; decode at {cluster.bandwidth_efficiency:g} of memory bandwidth)",
        f"{'rows':>20}: {cost.rows} ({cost.trajectories} trajectories)",
        f"{'phase':>20}  {'tokens':>9} {'computed':>9} {'padding':>7} {'micro/rank':>10} {'FLOP':>9} "
        f"{'seconds':>9} {'share':>6}",
    ]
    total = cost.seconds
    for phase in cost.phases.values():
        if phase.flops == 0:
            lines.append(
                f"{phase.name:>20}  {'-':>9} {'-':>9} {'-':>7} {'-':>10} {'-':>9} {0:9.4g} {0:6.0%}  "
                + "; ".join(phase.notes)
            )
            continue
        lines.append(
            f"{phase.name:>20}  {count(phase.tokens):>9} {count(phase.computed_tokens):>9} {phase.padding:7.1%} "
            f"{phase.micro_batches or '-':>10} {phase.flops:9.3g} {phase.seconds:9.4g} {phase.seconds / total:6.0%}"
            + ("  " + "; ".join(phase.notes) if phase.notes else "")
        )
    lines.append(f"{'step (modelled)':>20}  {total:60.4g}  (weight sync, reward, advantage not modelled)")
    for phase, seconds in inputs.reported.items():
        if phase == "step":
            lines.append(f"{'reported step':>20}: {seconds:g} s, {seconds / total:.3g} x the modelled {total:.4g} s")
            continue
        modelled = cost.phases[phase].seconds
        if modelled == 0:
            lines.append(f"{'reported ' + phase:>20}: {seconds:g} s, but the model runs no such pass")
            continue
        # FLOP-bound: time is inversely proportional to utilisation.
        reconciling = cluster.utilisation[phase] * modelled / seconds
        lines.append(
            f"{'reported ' + phase:>20}: {seconds:g} s against {modelled:.4g} s modelled: utilisation "
            f"{reconciling:.3g} reconciles them"
        )
    return lines
