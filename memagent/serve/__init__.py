"""An agent behind an OpenAI-compatible endpoint (``python -m memagent.serve``): the OpenAI chat API outside, a
registered agent inside (the memory loop of :mod:`memagent.agent` by default, any other by name or file
path), every model call sent to an upstream OpenAI-compatible server.

- :mod:`memagent.serve.questions`: where a request holds the document and the question (the question modes);
- :mod:`memagent.serve.protocol`: the request checked field by field, errors in OpenAI's shape, upstream failures
  as HTTP statuses;
- :mod:`memagent.serve.service`: the documents in flight (the agent from its registration, admission, turns,
  cancellation, drain, counters);
- :mod:`memagent.serve.app`: the FastAPI app (plain and streamed answers, client disconnects);
- :mod:`memagent.serve.cli`: the command line (flags, ``--config``, a local upstream, uvicorn, SIGTERM).

docs/serving.md describes it for users.
"""
