"""The inputs of the step cost model from a composed config, the data and the command line, and its printed table.

``python -m verl_ext.plan`` prints it (docs/cluster.md, "What a step costs"). Every input says where it came from:
the model's shape (its local ``config.json``, else the published sizes), the documents (the training parquet's
rows of the step, else the paper's document length, assumed), the generated lengths (the caps unless given), the
prompt templates (the model's tokenizer, else an estimate), the cluster (GPU kind and count, utilisation assumed).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from recurrent.flops import PUBLISHED_SHAPES, ModelShape
from verl_ext.cost import (
    ASSUMED_QUESTION_TOKENS,
    DEVICES,
    ESTIMATED_QWEN_TEMPLATE_TOKENS,
    PAPER_CONTEXT_TOKENS,
    PHASES,
    TRAINING_PHASES,
    Cluster,
    Documents,
    Generated,
    StepCost,
    TemplateLengths,
    Turn,
    memory_agent_turns,
)

GPU_UTILISATION = 0.4  # of dense peak, every phase: an assumption until measured (docs/cluster.md)
REPORTABLE = (*TRAINING_PHASES, "step")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("cost of a step (docs/cluster.md, 'What a step costs')")
    group.add_argument("--no-cost", dest="cost", action="store_false", help="print the step plan only")
    group.add_argument("--data", type=Path, help="training parquet (default: data.train_files when it exists)")
    group.add_argument("--step", type=int, default=1, help="which step's prompts, in file order (default 1)")
    group.add_argument("--tokenizer", help="tokenizer folder for --data (default: the model's, when local)")
    group.add_argument("--memory-tokens", type=int, help="tokens per memory update (default: the cap)")
    group.add_argument("--answer-tokens", type=int, help="tokens per final answer (default: the cap)")
    group.add_argument(
        "--question-tokens", type=int, default=ASSUMED_QUESTION_TOKENS, help="question length without a parquet"
    )
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
    args.context_tokens = PAPER_CONTEXT_TOKENS
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


def memory_config(config: DictConfig) -> Any:
    """The memory agent's settings (``recurrent.config``); the cost model knows no other agent's calls."""
    from recurrent.agents.memory import REGISTER
    from recurrent.interface import load_register
    from verl_ext.settings import recurrent_settings

    settings = recurrent_settings(config)
    register = load_register(settings.agent) if settings.agent else None
    if register is not REGISTER:
        raise ValueError(
            f"recurrent.agent={settings.agent or None}: the step cost model knows the memory agent's calls only "
            "(verl_ext/cost.py, memory_agent_turns); --no-cost prints the step plan"
        )
    return register.make_config(settings.agent_config)


def template_lengths(budgets: Any, tokenizer: Any | None, source: str = "its tokenizer") -> TemplateLengths:
    if tokenizer is None:
        return TemplateLengths(
            *ESTIMATED_QWEN_TEMPLATE_TOKENS, "estimated for Qwen2.5's chat format: no tokenizer here"
        )
    from recurrent.agents.memory import MemoryWorkflow

    workflow = MemoryWorkflow(budgets, tokenizer)
    return TemplateLengths(
        workflow.memory_ids_template.length,
        workflow.final_ids_template.length,
        len(workflow.no_memory_ids),
        f"counted with {source}",
    )


def train_file(config: DictConfig) -> Path | None:
    files = config.data.train_files
    files = [files] if isinstance(files, str) else list(files)
    return Path(files[0]) if len(files) == 1 and Path(files[0]).is_file() else None


def read_documents(path: Path, budgets: Any, tokenizer: Any, first: int, count: int) -> Documents:
    """The step's prompts from a training parquet: each row's context and question through the memory agent's
    own tokenization and centre truncation (``MemoryWorkflow.session``)."""
    import pyarrow.parquet as pq

    from recurrent.agents.memory import MemoryWorkflow

    table = pq.read_table(path)
    if table.num_rows < first + count:
        raise ValueError(f"{path}: {table.num_rows} rows, the step needs rows {first + 1} to {first + count}")
    workflow = MemoryWorkflow(budgets, tokenizer)
    contexts, questions = [], []
    for index, sample in enumerate(table.slice(first, count).to_pylist(), start=first):
        try:
            session = workflow.session(sample)
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"{path}, row {index}: {err}") from err
        contexts.append(len(session.context_ids))
        questions.append(len(session.question_ids))
    return Documents(contexts, questions, f"{path}, rows {first + 1}-{first + count}")


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


class CostInputs:
    """Everything the model needs besides the config, each with where it came from."""

    def __init__(self, config: DictConfig, args: argparse.Namespace) -> None:
        self.budgets = memory_config(config)
        folder = model_folder(config)
        self.shape, self.shape_source = model_shape(config, folder)
        tokenizer_folder = args.tokenizer or folder
        tokenizer = None
        if tokenizer_folder is not None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(tokenizer_folder)
        where = "the model's tokenizer" if args.tokenizer is None else f"the tokenizer of {args.tokenizer}"
        self.templates = template_lengths(self.budgets, tokenizer, where)
        if args.step < 1:
            raise ValueError(f"--step {args.step}: steps count from 1")
        prompts = int(config.data.train_batch_size)
        data = args.data or train_file(config)
        if data is not None:
            if not data.is_file():
                raise ValueError(f"--data {data}: no such file")
            if tokenizer is None:
                raise ValueError(f"--data {data} needs the model's tokenizer: give --tokenizer FOLDER")
            self.documents = read_documents(data, self.budgets, tokenizer, (args.step - 1) * prompts, prompts)
        else:
            question = min(args.question_tokens, self.budgets.max_prompt_length)
            self.documents = Documents(
                [args.context_tokens] * prompts,
                [question] * prompts,
                f"assumed: no parquet, every document {args.context_tokens:,} tokens"
                + (" (the paper's)" if args.context_tokens == PAPER_CONTEXT_TOKENS else "")
                + f", questions {question} tokens (--data FILE reads them)",
            )
        caps = (self.budgets.max_memorization_length, self.budgets.max_final_response_length)
        memory = args.memory_tokens if args.memory_tokens is not None else caps[0]
        answer = args.answer_tokens if args.answer_tokens is not None else caps[1]
        for name, value, cap in (("--memory-tokens", memory, caps[0]), ("--answer-tokens", answer, caps[1])):
            if not 1 <= value <= cap:
                raise ValueError(f"{name} {value}: between 1 and the cap, {cap}")
        given = args.memory_tokens is not None or args.answer_tokens is not None
        self.generated = Generated(memory, answer, "given" if given else "the caps, an upper bound")
        self.cluster = cluster_from(config, args)
        self.reported = reported_times(args.reported)

    def trajectories(self) -> list[list[Turn]]:
        return [
            memory_agent_turns(c, q, self.budgets, self.templates, self.generated)
            for c, q in zip(self.documents.context_tokens, self.documents.question_tokens, strict=True)
        ]


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
        f"{'documents':>20}: {inputs.documents.source}",
        f"{'generated':>20}: memory {inputs.generated.memory}, answer {inputs.generated.answer} tokens a turn "
        f"({inputs.generated.source})",
        f"{'templates':>20}: memory turn {inputs.templates.memory}, final turn {inputs.templates.final} tokens "
        f"({inputs.templates.source})",
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
