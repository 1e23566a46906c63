"""CPU-scale experiments: tasks, warm starts and runs that show the framework's claims on a 2-core machine
(``calculator``: the tool-using arithmetic agent trained by RL; docs/write_your_own_agent.md)."""
