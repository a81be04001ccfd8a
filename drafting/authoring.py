"""Writing templates: a template's versions are immutable; which one drafts use is published.

Bad source raises :class:`~drafting.templating.TemplateError` (with a line and column where the
parser knows them) before anything is written.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import transaction

from drafting.models import DocumentTemplate, TemplateVersion
from drafting.templating import TemplateError, parse_template


@transaction.atomic
def template_version_create(
    *, slug: str, title: str, kind: str, source: str, description: str = "",
    route_hint: str = "auto", user: Any = None, doc_format: str = "text",
) -> TemplateVersion:  # fmt: skip
    """Validate ``source`` and save it as the template's next version (creating the template)."""
    parsed = parse_template(source, max_bytes=settings.STENCIL_MAX_TEMPLATE_BYTES,
                            doc_format=doc_format)  # fmt: skip
    if route_hint not in {"auto", "diffusion", "ar"}:
        raise TemplateError(f"route hint {route_hint!r} is not auto, diffusion or ar")
    template, _ = DocumentTemplate.objects.get_or_create(
        slug=slug, defaults={"title": title, "kind": kind, "description": description}
    )
    template.title, template.kind, template.description = title, kind, description
    template.save()
    latest = template.versions.select_for_update().order_by("-number").first()
    if latest is not None and (latest.source, latest.route_hint, latest.doc_format) == (
        source, route_hint, doc_format
    ):
        return latest
    return TemplateVersion.objects.create(
        template=template,
        number=(latest.number + 1) if latest else 1,
        source=source,
        fields=[f.to_json() for f in parsed.fields],
        holes=[h.to_json() for h in parsed.holes],
        route_hint=route_hint,
        doc_format=doc_format,
        created_by=user if getattr(user, "is_authenticated", False) else None,
    )
