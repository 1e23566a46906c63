"""A reward only the whole trajectory can give, for the self-consistency agent (self_consistency_agent.py): the
share of its drafts, the calls before its answer, whose reply holds a digit. verl calls it with the last reply
(``solution_str``) and the trajectory in ``extra_info`` (verl_ext/agent_loop_manager.py)."""


def drafts_with_a_digit(data_source, solution_str, ground_truth, extra_info=None, **_):
    drafts = extra_info["trajectory"][:-1]
    assert extra_info["trajectory"][-1]["reply"] == solution_str  # the last call is the answer verl scores
    return sum(any(ch.isdigit() for ch in call["reply"]) for call in drafts) / len(drafts)
