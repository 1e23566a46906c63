"""MemAgent behind an OpenAI-compatible endpoint (``python -m recurrent.serve``): the OpenAI chat API outside, the
memory loop of :mod:`recurrent.agents.memory` inside, every turn sent to an upstream OpenAI-compatible server.

- :mod:`recurrent.serve.questions`: where a request holds the document and the question (the question modes);
- :mod:`recurrent.serve.protocol`: the request checked field by field, errors in OpenAI's shape, upstream failures
  as HTTP statuses;
- :mod:`recurrent.serve.service`: the documents in flight (admission, turns, cancellation, drain, counters);
- :mod:`recurrent.serve.app`: the FastAPI app (plain and streamed answers, client disconnects);
- :mod:`recurrent.serve.cli`: the command line (flags, ``--config``, a local upstream, uvicorn, SIGTERM).

docs/serving.md describes it for users.
"""
