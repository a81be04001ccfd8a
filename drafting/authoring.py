"""Writing templates: a template's versions are immutable; which one drafts use is published.

Bad source raises :class:`~drafting.templating.TemplateError` (with a line and column where the
parser knows them) before anything is written.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import transaction

from drafting.models import DocumentTemplate, TemplateVersion
from drafting.templating import ParsedTemplate, TemplateError, parse_template
from gpu_worker.engine.domain import assess_text

SLUG_RE = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,78}[a-z0-9])?")
UNFAMILIAR_WARNING = "The model was not trained on documents like this; its text will need rewriting."


def template_domain(*, parsed: ParsedTemplate) -> dict[str, Any] | None:
    """The locked text's domain score against the denoiser's training corpus (pure Python,
    no model loaded): ``{"score", "unfamiliar", "threshold", "warning"}``, the warning empty
    when the text is familiar; None when the model ships no domain profile."""
    texts = [p.text for p in parsed.pieces if p.kind == "text"]
    assessed = assess_text(settings.STENCIL_MODEL_DIR, texts)
    if assessed is None:
        return None
    return {**assessed, "warning": UNFAMILIAR_WARNING if assessed["unfamiliar"] else ""}


def template_version_domain(*, version: TemplateVersion) -> dict[str, Any] | None:
    """:func:`template_domain` of a saved version."""
    parsed = parse_template(version.source, max_bytes=settings.STENCIL_MAX_TEMPLATE_BYTES,
                            doc_format=version.doc_format)  # fmt: skip
    return template_domain(parsed=parsed)


@transaction.atomic
def template_version_create(
    *, slug: str, title: str, kind: str, source: str, description: str = "",
    route_hint: str = "auto", user: Any = None, doc_format: str = "text", publish: bool = True,
) -> TemplateVersion:  # fmt: skip
    """Validate ``source`` and save it as the template's next version (creating the template).

    ``publish``: new drafts use this version from now on (the editor saves unpublished).
    """
    parsed = parse_template(source, max_bytes=settings.STENCIL_MAX_TEMPLATE_BYTES,
                            doc_format=doc_format)  # fmt: skip
    if route_hint not in {"auto", "diffusion", "ar"}:
        raise TemplateError(f"route hint {route_hint!r} is not auto, diffusion or ar")
    if not isinstance(slug, str) or not SLUG_RE.fullmatch(slug):
        raise TemplateError(
            f"slug {slug!r} must be 1-80 lowercase letters, digits and hyphens "
            "(it names the template in addresses)"
        )
    template, _ = DocumentTemplate.objects.get_or_create(
        slug=slug, defaults={"title": title, "kind": kind, "description": description}
    )
    template.title, template.kind, template.description = title, kind, description
    template.save()
    latest = template.versions.select_for_update().order_by("-number").first()
    if latest is not None and (latest.source, latest.route_hint, latest.doc_format) == (
        source, route_hint, doc_format
    ):
        if publish and template.published_version_id != latest.pk:
            template_publish(template=template, version=latest)
        return latest
    version = TemplateVersion.objects.create(
        template=template,
        number=(latest.number + 1) if latest else 1,
        source=source,
        fields=[f.to_json() for f in parsed.fields],
        holes=[h.to_json() for h in parsed.holes],
        route_hint=route_hint,
        doc_format=doc_format,
        created_by=user if getattr(user, "is_authenticated", False) else None,
    )
    if publish:
        template_publish(template=template, version=version)
    return version


def user_is_template_author(user: Any) -> bool:
    """Template authors (the permission, or staff) write, check and publish templates."""
    return bool(getattr(user, "is_authenticated", False) and (
        user.is_staff or user.has_perm("drafting.author_template")))  # fmt: skip


def template_publish(*, template: DocumentTemplate, version: TemplateVersion) -> None:
    """New drafts of ``template`` use ``version`` (drafts already made keep theirs)."""
    if version.template_id != template.pk:
        raise TemplateError(f"version {version.number} is not a version of {template.slug!r}")
    DocumentTemplate.objects.filter(pk=template.pk).update(published_version=version)
    template.published_version = version


def template_unpublish(*, template: DocumentTemplate) -> None:
    """Offer the template to nobody; drafts already made keep working."""
    DocumentTemplate.objects.filter(pk=template.pk).update(published_version=None)
    template.published_version = None


@dataclass(frozen=True)
class TemplateCheck:
    """What a template source makes, or why it cannot be saved (line and column 1-based)."""

    parsed: ParsedTemplate | None
    error: str = ""
    line: int = 0
    column: int = 0

    def to_json(self) -> dict[str, Any]:
        if self.parsed is None:
            return {"ok": False, "errors": [{"message": self.error, "line": self.line,
                                             "column": self.column}]}  # fmt: skip
        parsed = self.parsed
        return {
            "ok": True, "errors": [], "doc_format": parsed.doc_format,
            "fields": [f.to_json() for f in parsed.fields],
            "holes": [h.to_json() for h in parsed.holes],
            "pieces": [{"kind": p.kind, "name": p.name, "text": p.text} for p in parsed.pieces],
            "document_schema": parsed.document_schema(),
            "domain": template_domain(parsed=parsed),
        }  # fmt: skip


def template_check(*, source: str, doc_format: str = "text") -> TemplateCheck:
    try:
        parsed = parse_template(source, max_bytes=settings.STENCIL_MAX_TEMPLATE_BYTES,
                                doc_format=doc_format)  # fmt: skip
    except TemplateError as exc:
        return TemplateCheck(None, str(exc), exc.line, exc.column)
    return TemplateCheck(parsed)


def template_version_diff(*, old: TemplateVersion | None, new: TemplateVersion) -> str:
    """Unified diff of two versions' sources ('' for a first version)."""
    if old is None:
        return ""
    return "".join(difflib.unified_diff(
        old.source.splitlines(keepends=True), new.source.splitlines(keepends=True),
        fromfile=f"version {old.number}", tofile=f"version {new.number}",
    ))  # fmt: skip
