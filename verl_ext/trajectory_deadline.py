"""A deadline for every trajectory in training (``recurrent.trajectory_timeout_s``): an agent that does not finish
fails its own trajectory, counted with the step's failed ones, and the step goes on (docs/fidelity.md, "Sync mode
and failed rollouts").

The agent's code runs on an event loop of its own in a worker thread (recurrent/agent_thread.py), so the deadline
holds whatever it does: it awaits forever, computes without awaiting, sleeps in ``time.sleep`` or raises
``SystemExit``. In async mode the deadline ends the trajectory wherever its agent is, a model call included. In
sync mode a call waits at the lockstep barrier with every other agent's, and one cancelled there would leave the
round holding it: a call in progress runs to its end (the rollout server's own limits bound it), the trajectory
fails as it returns, and a call asked for past the deadline is refused before it reaches the barrier.
"""

from __future__ import annotations

from recurrent.agent_thread import AgentDeadlineError, Deadline

KEY = "recurrent.trajectory_timeout_s"
# Its default: a trajectory of the paper's training (a ~28K-token document read in 5,000-token chunks: about 7
# calls of at most 1,024 new tokens) takes minutes, the whole batch's rollout in sync mode; an hour is a generous
# multiple, and still ends an agent that hangs within the run (docs/fidelity.md, "Sync mode and failed rollouts").
TRAJECTORY_DEADLINE_S = 3_600.0


class TrajectoryTimeoutError(AgentDeadlineError):
    """A trajectory whose agent did not finish within ``recurrent.trajectory_timeout_s``."""


def trajectory_deadline(seconds: float | None, mode: str) -> Deadline | None:
    """The deadline of every trajectory of a run in ``mode`` (None: ``recurrent.trajectory_timeout_s=null``)."""
    if seconds is None:
        return None
    return Deadline(seconds, KEY, "its trajectory", cancel_calls=mode == "async", error=TrajectoryTimeoutError)
