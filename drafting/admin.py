"""Admin: templates (new versions go through the service, so they are validated), drafts,
revisions (read-only: they are immutable), jobs (cancel action) and API tokens."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from drafting import services
from drafting.models import (
    ApiToken,
    DocumentTemplate,
    Draft,
    DraftRevision,
    Fragment,
    InfillJob,
    TemplateVersion,
)
from drafting.templating import TemplateError, parse_template


class TemplateVersionInline(admin.TabularInline):
    model = TemplateVersion
    fields = ("number", "route_hint", "created", "created_by")
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(DocumentTemplate)
class DocumentTemplateAdmin(admin.ModelAdmin):
    list_display = ("title", "slug", "kind", "created")
    search_fields = ("title", "slug", "kind")
    inlines = [TemplateVersionInline]


class TemplateVersionForm(forms.ModelForm):
    class Meta:
        model = TemplateVersion
        fields = ("template", "source", "route_hint")

    def clean_source(self) -> str:
        source: str = self.cleaned_data["source"]
        try:
            parse_template(source)
        except TemplateError as exc:
            raise forms.ValidationError(str(exc)) from exc
        return source


@admin.register(TemplateVersion)
class TemplateVersionAdmin(admin.ModelAdmin):
    """Versions are immutable: 'add' saves the template's next version through the service."""

    form = TemplateVersionForm
    list_display = ("template", "number", "route_hint", "created", "created_by")
    list_filter = ("template",)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        if obj is None:
            return ()
        return ("template", "number", "source", "fields", "holes", "route_hint", "created",
                "created_by")  # fmt: skip

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is None:
            return ("template", "source", "route_hint")
        return self.get_readonly_fields(request, obj)

    def save_model(self, request: HttpRequest, obj: TemplateVersion, form: Any, change: bool
                   ) -> None:  # fmt: skip
        if change:
            return
        template = obj.template
        saved = services.template_version_create(
            slug=template.slug, title=template.title, kind=template.kind, source=obj.source,
            description=template.description, route_hint=obj.route_hint, user=request.user,
        )  # fmt: skip
        obj.pk, obj.number = saved.pk, saved.number
        obj._state.adding = False


class FragmentInline(admin.TabularInline):
    model = Fragment
    fields = ("position", "kind", "name", "text", "locked", "status")
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Draft)
class DraftAdmin(admin.ModelAdmin):
    list_display = ("title", "owner", "template_version", "revision", "accepted_revision",
                    "updated")  # fmt: skip
    list_filter = ("template_version__template",)
    search_fields = ("title", "owner__username")
    readonly_fields = ("revision", "accepted_revision", "values")
    inlines = [FragmentInline]


@admin.register(DraftRevision)
class DraftRevisionAdmin(admin.ModelAdmin):
    list_display = ("draft", "number", "reason", "accepted", "created", "created_by")
    list_filter = ("accepted", "reason")

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


@admin.action(description="Cancel the selected jobs")
def cancel_jobs(modeladmin: Any, request: HttpRequest, queryset: QuerySet[InfillJob]) -> None:
    for job in queryset:
        services.infill_job_cancel(job=job)
    messages.success(request, f"Asked {queryset.count()} job(s) to stop.")


@admin.register(InfillJob)
class InfillJobAdmin(admin.ModelAdmin):
    list_display = ("id", "owner", "draft", "state", "preset", "route", "delivery_count",
                    "created", "finished")  # fmt: skip
    list_filter = ("state", "route", "preset")
    search_fields = ("id", "owner__username")
    actions = [cancel_jobs]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [f.name for f in InfillJob._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ("name", "user", "prefix", "created", "last_used")
    readonly_fields = ("prefix", "key_sha256", "created", "last_used")
    search_fields = ("name", "user__username")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # keys are made on /tokens/, where the key is shown once
