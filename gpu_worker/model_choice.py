"""Which denoiser a job runs with, asked once per job before its first attempt.

The model version promoted for the job's template, else the default promotion
(:func:`corpora.selectors.promotion_in_force`), else the configured ``STENCIL_MODEL_DIR``.
Asked per job, so a promotion or a rollback takes effect with the next job a worker claims,
without a restart. The answer is a directory and, for a version, the weights hash its row
registered: the worker's cache (:mod:`gpu_worker.runtime`) loads and checks it.

A version serves the diffusion route; the AR-FIM model is always ``STENCIL_AR_MODEL_DIR``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings

from corpora.models import ModelVersion
from corpora.selectors import promotion_in_force
from drafting.models import InfillJob

CONFIGURED = "configured"  # no promotion in force: STENCIL_MODEL_DIR
DEFAULT = "default"  # the version promoted as the default


@dataclass(frozen=True)
class ModelChoice:
    directory: Path
    weights_sha256: str | None  # the version's registered hash; None for the configured model
    version_id: int | None  # the ModelVersion row (None: the configured model)
    version_name: str
    scope: str  # "template:<slug>", "default" or "configured": why this model

    @property
    def is_version(self) -> bool:
        return self.version_id is not None

    def describe(self) -> str:
        return f"model version {self.version_name} (id {self.version_id}, {self.scope})"

    def record(self, weights_sha256: str) -> dict[str, Any]:
        """What the run record says of the version (``weights_sha256``: of the weights that ran).

        For the configured model, the row registered for those weights, if there is one."""
        version_id, name = self.version_id, self.version_name
        if version_id is None:
            row = (ModelVersion.objects.filter(weights_sha256=weights_sha256)
                   .order_by("-state", "id").values_list("pk", "name").first())  # fmt: skip
            if row is not None:
                version_id, name = row
        return {"id": version_id, "name": name, "weights_sha256": weights_sha256,
                "scope": self.scope}  # fmt: skip


def model_choice(job: InfillJob) -> ModelChoice:
    """The denoiser ``job`` runs with (see the module docstring)."""
    version = job.draft.template_version if job.draft_id is not None and job.draft else None
    template = version.template if version is not None else None
    promotion = promotion_in_force(template=template)
    if promotion is None:
        directory = Path(settings.STENCIL_MODEL_DIR)
        return ModelChoice(directory=directory, weights_sha256=None, version_id=None,
                           version_name=directory.name, scope=CONFIGURED)  # fmt: skip
    row = promotion.model_version
    scope = DEFAULT
    if promotion.template_id is not None and template is not None:
        scope = f"template:{template.slug}"
    return ModelChoice(directory=Path(row.directory), weights_sha256=row.weights_sha256,
                       version_id=row.pk, version_name=row.name, scope=scope)  # fmt: skip
