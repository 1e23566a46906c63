"""The evaluation harness: models x tasks x lengths through OpenAI-compatible servers, as in the paper.
How the paper's protocol differs from training: ``docs/fidelity.md``, "Evaluation: the paper's protocol".

``python -m taskutils.memory_eval.run`` (or ``cd taskutils/memory_eval && python run.py``) evaluates any agent, by
registered name or file (the memory agent is ``recurrent.impls.memory``, the full-context baseline
``recurrent.impls.direct``); ``python -m taskutils.memory_eval.report RESULTS_DIR`` makes the summary table and the
accuracy-vs-length plot. The modules: the model table and options (``config``), the eval sets (``evalsets``), the
model servers the harness starts or joins (``model_servers``), the concurrent runner (``runner``), resumable
per-item results (``results``) and scoring (``scoring``).
"""
