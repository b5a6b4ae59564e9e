"""Tasks: taskfile.py (a task file parsed and checked; a task rendered to its prefix text and
input wrapping) and datafile.py (the {"input", "output"} JSONL files of train, distill and eval)."""

from .taskfile import (GEN_KEYS, RenderedTask, TaskSpec, case_collision, fill_template, load_tasks,
                       render_task, task_name_problem, task_where, text_hash)

__all__ = ["GEN_KEYS", "RenderedTask", "TaskSpec", "case_collision", "fill_template", "load_tasks",
           "render_task", "task_name_problem", "task_where", "text_hash"]
