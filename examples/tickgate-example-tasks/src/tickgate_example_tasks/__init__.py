"""An example Tickgate task plugin.

Tickgate finds these tasks through the `tickgate.tasks` entry points declared in
pyproject.toml, or through TICKGATE_TASK_MODULES=tickgate_example_tasks.greet,...
"""
