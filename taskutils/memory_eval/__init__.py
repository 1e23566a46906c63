"""The evaluation harness: models x tasks x lengths through OpenAI-compatible servers, as in the paper.
How the paper's protocol differs from training: ``docs/fidelity.md``, "Evaluation: the paper's protocol".

``python -m taskutils.memory_eval.run`` evaluates (in this folder, ``python run.py``, the same);
``python -m taskutils.memory_eval.report RESULTS_DIR`` makes the summary table and the accuracy-vs-length plot. The
agents are the registry's (the memory agent ``recurrent.impls.memory``, the direct baseline
``recurrent.impls.direct``); this package adds the command line (:mod:`.arguments`), the agent of a method
(:mod:`.agents`), the plan of results files (:mod:`.planning`), the model table (:mod:`.config`), eval sets
(:mod:`.evalsets`), servers (:mod:`.model_servers`), the models' threads (:mod:`.supervise`), the concurrent runner
(:mod:`.runner`), scoring (:mod:`.scoring`), resumable per-item results (:mod:`.results`) and the summary
(:mod:`.report`).
"""
