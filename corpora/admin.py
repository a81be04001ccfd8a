"""Admin: corpora (documents listed without their text), training runs with their progress
(cancel action), model versions and promotions (read-only history)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from corpora import services
from corpora.models import (
    Corpus,
    CorpusDocument,
    CorpusImport,
    ModelVersion,
    Promotion,
    ReviewFeed,
    TrainingRun,
)


class ReadOnly(admin.ModelAdmin):
    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Corpus)
class CorpusAdmin(ReadOnly):
    list_display = ("name", "documents", "tokens", "owner", "created")


@admin.register(CorpusDocument)
class CorpusDocumentAdmin(ReadOnly):
    list_display = ("name", "corpus", "tokens", "chars", "sha256", "key_id", "created")
    list_filter = ("corpus",)
    exclude = ("nonce", "ciphertext")  # the text is read on the staff page, decrypted


@admin.register(CorpusImport)
class CorpusImportAdmin(ReadOnly):
    list_display = ("corpus", "created", "added", "skipped", "created_by")


@admin.register(TrainingRun)
class TrainingRunAdmin(ReadOnly):
    list_display = ("id", "corpus", "state", "step", "loss", "tokens", "time_left", "model_version",
                    "created")  # fmt: skip
    list_filter = ("state",)
    actions = ["cancel"]

    @admin.display(description="step")
    def step(self, run: TrainingRun) -> str:
        p = run.progress or {}
        return f"{p.get('step', 0)} of {p.get('total_steps') or '?'}"

    @admin.display(description="loss")
    def loss(self, run: TrainingRun) -> str:
        value = (run.progress or {}).get("loss")
        return f"{value:.3f}" if isinstance(value, float) else "—"

    @admin.display(description="tokens")
    def tokens(self, run: TrainingRun) -> int:
        return int((run.progress or {}).get("tokens", 0))

    @admin.display(description="time left")
    def time_left(self, run: TrainingRun) -> str:
        eta = (run.progress or {}).get("eta_seconds")
        return f"{eta:.0f} s" if isinstance(eta, int | float) and not run.is_final else "—"

    @admin.action(description="Cancel the selected runs")
    def cancel(self, request: HttpRequest, queryset: QuerySet[TrainingRun]) -> None:
        for run in queryset:
            services.training_run_cancel(run=run)
        messages.success(request, f"Cancel asked for {queryset.count()} run(s).")


@admin.register(ModelVersion)
class ModelVersionAdmin(ReadOnly):
    list_display = ("name", "state", "weights_sha256", "parent", "corpus", "created")


@admin.register(Promotion)
class PromotionAdmin(ReadOnly):
    list_display = ("model_version", "template", "created", "created_by", "rolled_back")


@admin.register(ReviewFeed)
class ReviewFeedAdmin(admin.ModelAdmin):
    """Opt a template into learning from review: its accepted drafts join the corpus."""

    list_display = ("template", "corpus", "enabled", "documents_added", "created")
    list_filter = ("enabled",)
    readonly_fields = ("documents_added", "created_by", "created")

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        if not change:
            obj.created_by = request.user
        super().save_model(request, obj, form, change)
