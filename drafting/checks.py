"""Reads that judge a draft's document: how a span is named, and why the text cannot be accepted
yet (empty infills, broken constraints, a JSON record that does not parse or fit its schema)."""

from __future__ import annotations

from django.conf import settings

from drafting import docformat
from drafting.models import Draft, Fragment, TemplateVersion
from drafting.templating import ParsedTemplate, parse_template


def version_parse(version: TemplateVersion) -> ParsedTemplate:
    return parse_template(version.source, max_bytes=settings.STENCIL_MAX_TEMPLATE_BYTES,
                          doc_format=version.doc_format)  # fmt: skip


def fragment_display_label(fragment: Fragment) -> str:
    """A span's name as a person reads it: its label, a field's label, or its first words."""
    spec = fragment.spec or {}
    if spec.get("label"):
        return str(spec["label"])
    if fragment.kind == Fragment.Kind.FIELD:
        declared = {f["name"]: f for f in fragment.draft.template_version.fields}
        return str(declared.get(fragment.name, {}).get("label") or _humanize(fragment.name))
    if fragment.name:
        return _humanize(fragment.name)
    words = " ".join((fragment.text or spec.get("hint", "")).split())
    return f"“{words[:37]}…”" if len(words) > 40 else f"“{words}”"


def _humanize(name: str) -> str:
    return name.replace("_", " ").strip().capitalize()


def draft_document_violations(*, draft: Draft) -> list[docformat.Violation]:
    """Why the draft's text cannot be accepted: empty infills, broken constraints, and for a
    JSON template, the document not parsing or not matching its schema."""
    from gpu_worker.engine.constraints import pattern_fullmatch

    fragments = list(draft.fragments.all())
    problems: list[docformat.Violation] = []
    for fragment in fragments:
        if fragment.kind != Fragment.Kind.FILL:
            continue
        label = fragment_display_label(fragment)
        spec = fragment.spec or {}
        value = docformat.unescape_for(fragment.text, spec.get("context", ""))
        constraint = spec.get("constraint") or {}
        if not fragment.text:
            problems.append(docformat.Violation(f"{label} is empty: regenerate it or write it",
                                                where=label))  # fmt: skip
        elif "choices" in constraint and value not in constraint["choices"]:
            problems.append(docformat.Violation(
                f"{label} must be one of: {', '.join(constraint['choices'])}", where=label))
        elif "pattern" in constraint and not pattern_fullmatch(constraint["pattern"], value):
            problems.append(docformat.Violation(
                f"{label} does not have the form the template asks for", where=label))
    version = draft.template_version
    if version.doc_format == "json" and not any(p.message.endswith("write it") for p in problems):
        schema = version_parse(version).document_schema() or {}
        text = "".join(f.text for f in fragments)
        problems.extend(docformat.json_document_violations(text, schema))
    return problems
