"""Which fields of a recipe apply to it: the model's and the task's fields depend on their `kind`, and the
warm-up only on a testbed model (a Hugging Face model starts from its pretrained weights). What a form
that fits a recipe leaves out (flows/forms.py); the models themselves keep every field, with its default,
so a recipe reads the same whichever fields its file gives."""

from __future__ import annotations

from probepo.config.run import RunConfig

MODEL_COMMON = ("kind",)
"""ModelConfig's fields that apply to every kind."""

MODEL_FIELDS = {
    "testbed": ("vocab_size", "d_model", "n_layers", "n_heads", "context", "mlp_ratio"),
    "hf": (
        "pretrained",
        "dtype",
        "generator",
        "vllm_memory",
        "trainer",
        "zero_stage",
        "gradient_checkpointing",
    ),
}
"""ModelConfig's fields of each kind (with MODEL_COMMON, every field: tests/unit/test_forms.py checks)."""

TASK_COMMON = ("kind", "seed")
"""TaskConfig's fields that apply to every kind."""

TASK_FIELDS = {
    "modchain": ("steps", "modulus", "ops"),
    "pointer": ("letters", "hops"),
    "math": (
        "source",
        "train_sources",
        "eval_set",
        "arithmetic_problems",
        "family",
        "instruction",
        "benchmarks_root",
    ),
}
"""TaskConfig's fields of each kind (with TASK_COMMON, every field)."""

SECTIONS_OF_MODEL = {"testbed": ("warmup",), "hf": ()}
"""RunConfig's sections only one model kind reads."""


def left_out(config: RunConfig) -> dict[str, tuple[str, ...] | None]:
    """What does not apply to `config`: per section (`model`, `task`), the fields of the other kinds, and
    each section of another model kind (None: the whole section)."""
    other_model = [f for kind, fields in MODEL_FIELDS.items() if kind != config.model.kind for f in fields]
    other_task = [f for kind, fields in TASK_FIELDS.items() if kind != config.task.kind for f in fields]
    found: dict[str, tuple[str, ...] | None] = {
        "model": tuple(other_model),
        "task": tuple(f for f in other_task if f not in TASK_FIELDS[config.task.kind]),
    }
    for kind, sections in SECTIONS_OF_MODEL.items():
        if kind != config.model.kind:
            found.update(dict.fromkeys(sections))
    return found
