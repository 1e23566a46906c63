"""The evaluation harness: models x tasks x lengths through OpenAI-compatible servers, as in the paper.
How the paper's protocol differs from training: ``docs/fidelity.md``, "Evaluation: the paper's protocol".

``python -m taskutils.memory_eval.run`` evaluates; ``python -m taskutils.memory_eval.report RESULTS_DIR`` makes
the summary table and the accuracy-vs-length plot. The memory agent itself is ``recurrent.impls.memory``; this
package adds the direct full-context baseline (:mod:`.direct`), scoring (:mod:`.scoring`), serving
(:mod:`.serve`), resumable per-item results (:mod:`.results`) and the concurrent runner (:mod:`.runner`).
"""
