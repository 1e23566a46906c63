"""An agent behind an OpenAI-compatible endpoint (``python -m taskutils.endpoint``): the OpenAI chat API outside, a
registered agent inside (the memory loop of :mod:`recurrent.impls.memory` by default, any other by name or file
path), every model call sent to an upstream OpenAI-compatible server.

- :mod:`taskutils.endpoint.questions`: where a request holds the document and the question (the question modes);
- :mod:`taskutils.endpoint.protocol`: the request checked field by field, errors in OpenAI's shape, upstream failures
  as HTTP statuses;
- :mod:`taskutils.endpoint.service`: the documents in flight, each request's life from its start to its answer;
- :mod:`taskutils.endpoint.admission`: the slots, the waiting queue, cancellation, the drain, the counters;
- :mod:`taskutils.endpoint.document_run`: an admitted request's run of the agent built from its registration (its
  episode, its turns, its outcome);
- :mod:`taskutils.endpoint.settings`: what the server answers with;
- :mod:`taskutils.endpoint.spool` and :mod:`taskutils.endpoint.spooled_body`: long requests kept on disk, and their
  bodies parsed there;
- :mod:`taskutils.endpoint.app`: the FastAPI app (plain and streamed answers, client disconnects);
- :mod:`taskutils.endpoint.connections`: what a connection may hold before its request is read (uvicorn's h11 with
  limits on a request's head, deadlines for its head and body, a bound on open connections);
- :mod:`taskutils.endpoint.cli`: the command line (flags, ``--config``, a local upstream, uvicorn, SIGTERM).

docs/serving.md describes it for users.
"""
