"""Tasks: taskfile.py (a task file parsed and checked; a task rendered to its prefix text and
input wrapping) and datafile.py (the {"input", "output"} JSONL files of train, distill and eval)."""

from .taskfile import (GEN_KEYS, MAX_LOGIT_BIAS, RenderedTask, TaskSpec, case_collision, check_generation,
                       check_text, fill_template, load_tasks, render_task, task_name_problem, task_where,
                       text_hash)

__all__ = ["GEN_KEYS", "MAX_LOGIT_BIAS", "RenderedTask", "TaskSpec", "case_collision", "check_generation",
           "check_text", "fill_template", "load_tasks", "render_task", "task_name_problem", "task_where",
           "text_hash"]
