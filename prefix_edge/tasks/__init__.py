"""Tasks: taskfile.py (a task file parsed and checked; a task rendered to its prefix text and
input wrapping), tokens.py (its prefix as token ids) and datafile.py (the {"input", "output"} JSONL files of train, distill and eval)."""

from .taskfile import (GEN_KEYS, TEXT_KEYS, RenderedTask, TaskSpec, case_collision, fill_template, load_tasks,
                       parse_task, render_task, task_name_problem, task_where, text_hash)
from .tokens import ids_sha256, leading_special_ids, prefix_ids

__all__ = ["GEN_KEYS", "RenderedTask", "TaskSpec", "case_collision", "fill_template", "ids_sha256", "leading_special_ids",
           "load_tasks", "parse_task", "prefix_ids", "render_task", "TEXT_KEYS", "task_name_problem", "task_where", "text_hash"]
