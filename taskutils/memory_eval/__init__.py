"""The evaluation harness: models x tasks x lengths through OpenAI-compatible servers, as in the paper.
How the paper's protocol differs from training: ``docs/fidelity.md``, "Evaluation: the paper's protocol".

``python -m taskutils.memory_eval.run`` (or ``cd taskutils/memory_eval && python run.py``) evaluates any agent, by
registered name or file (the memory agent is ``recurrent.impls.memory``, the full-context baseline
``recurrent.impls.direct``); ``python -m taskutils.memory_eval.report RESULTS_DIR`` makes the summary table and the
accuracy-vs-length plot. The modules: the command line (``arguments``), the model table (``config``), the agent of
a method (``agents``), the plan of results files (``planning``), the eval sets (``evalsets``), the model servers the
harness starts or joins (``model_servers``), the models' threads (``supervise``), the concurrent runner
(``runner``), resumable per-item results (``results``), scoring (``scoring``) and the summary (``report``).
"""
