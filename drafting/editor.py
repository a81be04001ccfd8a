"""The template editor's pages, for template authors: write a template's source beside its
syntax reference, see its form and locked text as you type, save versions, compare them,
publish one. Every page works without JavaScript (the Check button renders the preview)."""

from __future__ import annotations

from functools import wraps
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from drafting import authoring, selectors
from drafting.docformat import DOC_FORMATS
from drafting.forms import form_fields, post_text
from drafting.models import DocumentTemplate, TemplateVersion
from drafting.templating import TemplateError
from drafting.views import _diff_lines

NEW_TEMPLATE_SOURCE = """Dear {{ field("recipient", label="Recipient") }},

{% infill "body", max_tokens=48, label="Body" %}What the letter says{% endinfill %}

Kind regards,
{{ field("sender", label="Your name") }}
"""
TEMPLATE_TEXT_MAX = 200


def author_required(view: Any) -> Any:
    @login_required
    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not authoring.user_is_template_author(request.user):
            raise PermissionDenied("the template editor is for template authors")
        return view(request, *args, **kwargs)

    return wrapper


@author_required
@require_GET
def template_list(request: HttpRequest) -> HttpResponse:
    rows = [(t, t.latest_version()) for t in selectors.template_list()]
    return render(request, "drafting/editor_list.html", {"rows": rows})


def _preview_context(source: str, doc_format: str) -> dict[str, Any]:
    check = authoring.template_check(source=source, doc_format=doc_format)
    context: dict[str, Any] = {"check": check}
    if check.parsed is not None:
        fields = [f.to_json() for f in check.parsed.fields]
        labels = {h.name: h.label for h in check.parsed.holes}
        context["preview_fields"] = form_fields(fields, {}, {})
        context["preview_pieces"] = [
            {"kind": p.kind, "text": p.text,
             "label": labels.get(p.name) or next((f["label"] for f in fields
                                                  if f["name"] == p.name), p.name)}
            for p in check.parsed.pieces
        ]  # fmt: skip
    return context


@author_required
@require_http_methods(["GET", "POST"])
def template_edit(request: HttpRequest, slug: str | None = None) -> HttpResponse:
    template = selectors.template_get(slug=slug) if slug else None
    latest = template.latest_version() if template else None
    form = {
        "slug": template.slug if template else "",
        "title": template.title if template else "",
        "kind": template.kind if template else "letter",
        "description": template.description if template else "",
        "doc_format": latest.doc_format if latest else "text",
        "source": latest.source if latest else NEW_TEMPLATE_SOURCE,
    }
    status = 200
    error = ""
    if request.method == "POST":
        form.update({k: post_text(request.POST, k) for k in form if k in request.POST})
        if template is not None:
            form["slug"] = template.slug
        action = request.POST.get("action", "check")
        error = _form_error(form)
        if not error and action == "save":
            try:
                version = authoring.template_version_create(
                    slug=form["slug"], title=form["title"], kind=form["kind"],
                    source=form["source"], description=form["description"],
                    user=request.user, doc_format=form["doc_format"], publish=False,
                )  # fmt: skip
            except TemplateError:
                status = 400  # shown by the preview below, with its line and column
            else:
                messages.success(request, f"Saved as version {version.number} (not published: "
                                 "publish it when it is ready).")  # fmt: skip
                return redirect("drafting:template_edit", slug=version.template.slug)
        if error:
            status = 400
    context = {
        "template": template, "form": form, "form_error": error, "doc_formats": DOC_FORMATS,
        "versions": list(template.versions.order_by("-number")) if template else [],
        **_preview_context(form["source"], form["doc_format"]),
    }  # fmt: skip
    if context["check"].parsed is None and request.method == "POST":
        status = 400
    return render(request, "drafting/editor.html", context, status=status)


def _form_error(form: dict[str, str]) -> str:
    from django.utils.text import slugify

    if not form["slug"] or slugify(form["slug"]) != form["slug"]:
        return "The address name (slug) must be lowercase letters, digits and hyphens."
    if not form["title"].strip() or len(form["title"]) > TEMPLATE_TEXT_MAX:
        return f"Give the template a title (at most {TEMPLATE_TEXT_MAX} characters)."
    if not form["kind"].strip() or len(form["kind"]) > 60:
        return "Say what kind of document it is (at most 60 characters), e.g. letter."
    if form["doc_format"] not in DOC_FORMATS:
        return f"The document format must be one of {', '.join(DOC_FORMATS)}."
    return ""


@author_required
@require_POST
def template_preview(request: HttpRequest) -> HttpResponse:
    """The preview fragment for the editor's live preview (the same HTML the page renders)."""
    source = post_text(request.POST, "source")
    doc_format = post_text(request.POST, "doc_format") or "text"
    if doc_format not in DOC_FORMATS:
        doc_format = "text"
    context = _preview_context(source, doc_format)
    status = 200 if context["check"].parsed is not None else 400
    return render(request, "drafting/_template_preview.html", context, status=status)


def _version(template: DocumentTemplate, number: int | str) -> TemplateVersion:
    try:
        return template.versions.get(number=int(number))
    except (TemplateVersion.DoesNotExist, ValueError, TypeError) as exc:
        raise Http404("no such version") from exc


@author_required
@require_GET
def template_version(request: HttpRequest, slug: str, number: int) -> HttpResponse:
    template = selectors.template_get(slug=slug)
    version = _version(template, number)
    against = request.GET.get("against")
    old = _version(template, against) if against else (
        template.versions.filter(number__lt=version.number).order_by("-number").first())
    diff = authoring.template_version_diff(old=old, new=version)
    return render(request, "drafting/editor_version.html", {
        "template": template, "version": version, "old": old,
        "diff_lines": _diff_lines(diff),
        "versions": list(template.versions.order_by("-number")),
    })  # fmt: skip


@author_required
@require_POST
def template_publish(request: HttpRequest, slug: str) -> HttpResponse:
    template = selectors.template_get(slug=slug)
    version = _version(template, request.POST.get("version", ""))
    authoring.template_publish(template=template, version=version)
    messages.success(request, f"Version {version.number} is published: new drafts of "
                     f"“{template.title}” use it.")  # fmt: skip
    return redirect("drafting:template_edit", slug=template.slug)


@author_required
@require_POST
def template_unpublish(request: HttpRequest, slug: str) -> HttpResponse:
    template = selectors.template_get(slug=slug)
    authoring.template_unpublish(template=template)
    messages.success(request, f"“{template.title}” is unpublished: nobody can start a new "
                     "draft of it; drafts already made keep working.")  # fmt: skip
    return redirect("drafting:template_edit", slug=template.slug)
