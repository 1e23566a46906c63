"""The warm start of the CPU replication: plain-torch SFT of the ~1M-parameter reader, and its measurement.

    python -m experiments.needle.warm_start --cache [--quick] [--force] [--task choose [--recipe recall]]
    python -m experiments.needle.warm_start --out DIR [--steps 1030 200 75 146] [--p-needle 0.25] [--seed 0]
        [--stop-at 0.9] [--p-keep 0.9] [--copy-stages DIR] [--answer-steps 200] [--task choose]
    python -m experiments.needle.warm_start --evaluate DIR [--docs 32] [--chunks 1 2 4] [--sample] [--task choose]

Build (AdamW, loss on target tokens only, one CPU thread), five stages, each stopped at its target or its step
budget (:data:`FULL`: 1030 / 200 / 75 / 200 / 146 steps; :data:`QUICK`: a few steps, for tests of the pipeline).
Step budgets, not time caps, so the weights do not depend on the machine's speed.

1. ``synth``: 64 random tokens holding ``{ x1..xk }`` and ending with ``{ x1..xk }`` again, k = 24-30, so half
   the row is supervised copy (lr 3e-3, 100 warm-up steps, batch 32; stop at per-token accuracy 0.9). A dense
   copy signal forms copying in ~250 steps; spans of 4-12 tokens stall (docs/replication_probes.md).
2. ``needle``: a 1-chunk train document + "\\nmemory:" -> " " + needle sentence (stop at 0.9 exact).
3. ``paper``: the paper's memory prompt of a 1-chunk train document, built by the memory agent
   (:class:`recurrent.impls.memory.MemoryWorkflow`) -> needle sentence (lr 1e-3, 20 warm-up; stop at 0.9 exact).
4. ``answer``: the final prompt of a train document whose memory is its needle sentence -> ``\\boxed{number}``
   (lr 1e-3, 20 warm-up; stop at 0.9 exact; recipe 6, :func:`answer_rows`): the read-out, which the naive stage's
   final turns alone formed on one machine and not on another (docs/replication_cpu_notebook.md, "The build on
   another machine"). The choosing task's recipes have no answer stage.
5. ``naive``: every turn of naive-teacher transcripts of train documents of 1-4 chunks (no target).

The naive teacher (:func:`teacher_transcript`) knows the format, not a good reading policy: on a chunk holding the
needle it writes the needle sentence with probability ``p_needle`` (0.25: :data:`P_NEEDLE`), else the chunk's first
complete filler sentence; on a chunk without it, it keeps a needle already in memory with probability ``p_keep``,
else writes the chunk's first complete sentence. Final turn: ``\\boxed{number in memory}``, or a random 4-digit
guess. Its filler choice is positional (the first sentence), not random: a student of a teacher that writes the
needle with p = 0.5 and otherwise one of ~5 sentences at random decodes the needle greedily (the needle is the
mode), so greedy accuracy would far exceed the teacher's. Transcripts are episodes of the real memory agent
(``chunk_size`` 64, ``max_memorization_length`` 32) answered by the teacher, so the training prompts are the
evaluation prompts token for token.

The choosing task (``--task choose``; docs/replication_cpu_notebook.md, "The choosing task") has its own naive stage:
its documents hold the asked needle and 1-3 others (:func:`teacher_document`), and its teacher (:func:`choice_write`)
always writes one whole needle, the asked one with probability ``p_needle``, so that RL has only to learn which one
to keep. Its copy stages are the needle task's, kept in the cache beside it and reused (:func:`copy_stages_dir`).
Two recipes (``--recipe``, :data:`CHOOSE_RECIPES`): ``choice`` (the default; cache ``replication-reader-choose``)
adds a choice stage (copy a random needle of several, :func:`choice_rows`) and writes whole sentences; ``recall``
(``replication-reader-choose-recall``; "The choice taught with its answer") adds a recall stage instead (answer
the asked key's number from a short document, :func:`recall_rows`, stopped at exact 0.95) and writes numbers.

Saves a Hugging Face Qwen2 folder (model, tokenizer with chat template, generation config) with
``warm_start.json`` (recipe, stage logs with steps, stop reason, training and wall seconds).
:func:`cached_warm_start` keeps it in the offline model cache of :mod:`recurrent.models`
(``replication-reader``, ``replication-reader-quick``) with that module's manifest, written last.

The modules, one job each: :mod:`.rows` (the agent and the copy stages' rows), :mod:`.teachers` (the naive teachers
and their transcripts), :mod:`.stages` (the stage loop and the build), :mod:`.recipes` (the builds' sizes and recipe
versions), :mod:`.cache` (a folder or the model cache, and its manifest), :mod:`.evaluation` (the real agent's
accuracy), :mod:`.cli` (the command). Their public names are importable from here.
"""

from experiments.needle.warm_start.cache import (
    build,
    build_outcome,
    cached_warm_start,
    copy_stages_dir,
    manifest_extra,
)
from experiments.needle.warm_start.cli import main
from experiments.needle.warm_start.evaluation import HFGenerate, evaluate, whole_needles
from experiments.needle.warm_start.recipes import (
    CHOOSE,
    CHOOSE_QUICK,
    CHOOSE_RECALL,
    CHOOSE_RECALL_QUICK,
    CHOOSE_RECIPE_VERSION,
    CHOOSE_RECIPES,
    COPY_STAGES,
    FULL,
    QUICK,
    RECIPE_VERSION,
    TASKS,
    ChooseScale,
    Scale,
)
from experiments.needle.warm_start.rows import (
    ANSWER_ROWS,
    CHOOSE_DISTRACTORS,
    CHUNK_SIZE,
    FINAL_TOKENS,
    MEMORY_TOKENS,
    agent_config,
    answer_rows,
    choice_rows,
    needle_rows,
    paper_rows,
    recall_rows,
    sample_of,
)
from experiments.needle.warm_start.stages import train, train_stage
from experiments.needle.warm_start.teachers import (
    FORMS,
    NUMBER_RE,
    P_NEEDLE,
    TEACHERS,
    choice_write,
    complete_sentences,
    needle_write,
    teacher_document,
    teacher_rows,
    teacher_transcript,
)

__all__ = [
    "ANSWER_ROWS",
    "CHOOSE",
    "CHOOSE_DISTRACTORS",
    "CHOOSE_QUICK",
    "CHOOSE_RECALL",
    "CHOOSE_RECALL_QUICK",
    "CHOOSE_RECIPES",
    "CHOOSE_RECIPE_VERSION",
    "CHUNK_SIZE",
    "COPY_STAGES",
    "FINAL_TOKENS",
    "FORMS",
    "FULL",
    "MEMORY_TOKENS",
    "NUMBER_RE",
    "P_NEEDLE",
    "QUICK",
    "RECIPE_VERSION",
    "TASKS",
    "TEACHERS",
    "ChooseScale",
    "HFGenerate",
    "Scale",
    "agent_config",
    "answer_rows",
    "build",
    "build_outcome",
    "cached_warm_start",
    "choice_rows",
    "choice_write",
    "complete_sentences",
    "copy_stages_dir",
    "evaluate",
    "main",
    "manifest_extra",
    "needle_rows",
    "needle_write",
    "paper_rows",
    "recall_rows",
    "sample_of",
    "teacher_document",
    "teacher_rows",
    "teacher_transcript",
    "train",
    "train_stage",
    "whole_needles",
]
