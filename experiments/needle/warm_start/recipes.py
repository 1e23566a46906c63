"""The warm start's recipes: the size of each build (its stages' step budgets, pools, held-out sets, batch), the
builds the cache knows by name, and the recipe versions that make a cached build stale."""

from __future__ import annotations

from dataclasses import dataclass, replace

TASKS = ("needle", "choose")


@dataclass(frozen=True)
class Scale:
    """The size of a build: its name in the model cache, the step budget of each stage (synth, needle, paper,
    naive; a stage with a target may stop earlier), the training pools (needle rows, paper rows, naive-teacher
    transcripts), the held-out sets (synth, needle and paper rows, transcripts), the batch size and ``answer``, the
    budget of the answer stage after the copy stages (the final prompt with the needle in memory -> its boxed number,
    stopped at the copy stages' target; 0: none)."""

    name: str
    steps: tuple[int, int, int, int]
    pools: tuple[int, int, int] = (3000, 3000, 2400)
    held: tuple[int, int, int, int] = (256, 200, 200, 60)
    batch: int = 32
    answer: int = 0


@dataclass(frozen=True)
class ChooseScale(Scale):
    """The choosing task's build, with two stages between the copy stages and the naive one: ``recall``, the step
    budget of question answering over several needles (:func:`recall_rows`, stopped at exact ``recall_stop``;
    ``recall_held`` held-out rows) and ``choice``, that of copying one needle of several (:func:`choice_rows`;
    ``choice_rows``: its pool and held-out rows; ``choice_fresh``: new rows every step instead of the pool); 0: no
    such stage. ``form``: what the naive teacher writes of a
    needle (:data:`FORMS`). ``naive_replay``: the share of each naive-stage batch drawn from the choice stage's rows
    (its copy of one whole needle, replayed so that the teacher's transcripts do not train it away; 0: none)."""

    choice: int = 0
    choice_rows: tuple[int, int] = (3000, 200)
    recall: int = 0
    recall_held: int = 300
    recall_stop: float = 0.95
    form: str = "sentence"
    choice_fresh: bool = False
    naive_replay: float = 0.0


# The warm start: the budgets are the steps of the measured build (docs/replication_cpu_notebook.md, "Warm start"),
# whose stages stopped at time caps (synth, naive) or at their targets (needle, paper); the answer stage teaches the
# read-out that the naive stage alone formed on one machine and not on another ("The build on another machine").
FULL = Scale("replication-reader", steps=(1030, 200, 75, 146), answer=200)
# The same five stages in seconds, for tests of the pipeline's artefacts (its accuracy is that of a random model).
QUICK = Scale("replication-reader-quick", steps=(8, 2, 2, 2), pools=(64, 64, 16), held=(32, 16, 16, 4), answer=2)
# The choosing task's warm start (docs/replication_cpu_notebook.md, "The choosing task"): the same stages and budgets, a
# choice stage, its own naive stage (choosing documents, choice_write writing whole sentences), under its own names
# in the cache.
CHOOSE = ChooseScale(
    "replication-reader-choose", steps=(*FULL.steps[:3], 600), pools=(*FULL.pools[:2], 4800), choice=200
)
CHOOSE_QUICK = ChooseScale(
    "replication-reader-choose-quick",
    steps=QUICK.steps,
    pools=QUICK.pools,
    held=QUICK.held,
    choice=2,
    choice_rows=(64, 16),
)
# Its recall recipe (``--recipe recall``; docs/replication_cpu_notebook.md, "The choice taught with its answer"): a
# recall stage in place of the choice stage (the reader learns to answer the asked key's number from a short document;
# the choice formed after a plateau of ~3,000 steps in one run, and not within this budget in another), then a naive
# teacher that writes the number it picks.
CHOOSE_RECALL = replace(
    CHOOSE, name="replication-reader-choose-recall", steps=(*FULL.steps[:3], 300), choice=0, recall=8000, form="number"
)
CHOOSE_RECALL_QUICK = replace(
    CHOOSE_QUICK, name="replication-reader-choose-recall-quick", choice=0, recall=2, recall_held=16, form="number"
)
CHOOSE_RECIPES = {"choice": (CHOOSE, CHOOSE_QUICK), "recall": (CHOOSE_RECALL, CHOOSE_RECALL_QUICK)}
# Bump when the build changes (data, stages, optimizer), so a cached warm start built the old way is rebuilt.
# 2: the reader reads numbers as two-digit tokens; numbers dealt to splits at random. 3: the kernels' numerics pinned
# (experiments.sft.PINNED_NUMERICS), the manifest records the stages' stop steps and scores. 4: the tokenizer's
# corpus holds the digit pairs and the keys (experiments.needle.reader.DEFAULT_CORPUS). 5: the needle task's naive
# teacher writes the needle with p 0.25, not 0.4 (experiments.needle.warm_start.teachers.P_NEEDLE). 6: an answer stage
# after the copy stages (Scale.answer; the choosing task's recipes have none).
RECIPE_VERSION = 6
# The same for the choosing task's naive stage (its copy stages are the needle task's, RECIPE_VERSION).
CHOOSE_RECIPE_VERSION = 2  # 2: the recipe records its recall stage and memory form (recall recipe added)
COPY_STAGES = "copy_stages.json"  # in a copy_dir of train(): what the saved model's three stages were
