"""The template authors' JSON API: check a source (errors with line and column), list and add
versions, compare two, publish or unpublish. The same as the editor's pages."""

from __future__ import annotations

from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse

from drafting import authoring, selectors
from drafting.api import _typed, api_endpoint, template_json
from drafting.api_body import BadRequest, json_body
from drafting.docformat import DOC_FORMATS
from drafting.models import DocumentTemplate, TemplateVersion


def _author(request: HttpRequest) -> None:
    if not authoring.user_is_template_author(request.user):
        raise PermissionDenied("only template authors may do this")


def _doc_format(data: dict[str, object]) -> str:
    doc_format = _typed(data, "doc_format", str, "a string") or "text"
    if doc_format not in DOC_FORMATS:
        raise BadRequest(f"doc_format must be one of {', '.join(DOC_FORMATS)}",
                         errors={"doc_format": ", ".join(DOC_FORMATS)})  # fmt: skip
    return str(doc_format)


def _version(template: DocumentTemplate, number: int | str) -> TemplateVersion:
    try:
        return template.versions.get(number=int(number))
    except (TemplateVersion.DoesNotExist, ValueError, TypeError) as exc:
        raise Http404("no such version") from exc


def _version_json(template: DocumentTemplate, version: TemplateVersion) -> dict[str, object]:
    return {**template_json(version, source=True),
            "published": template.published_version_id == version.pk,
            "created": version.created.isoformat()}  # fmt: skip


@api_endpoint("POST")
def template_preview(request: HttpRequest) -> HttpResponse:
    """What a source makes (fields, holes, pieces, a JSON document's schema) or its error."""
    _author(request)
    data = json_body(request, allowed={"source", "doc_format"}, required={"source"})
    source = _typed(data, "source", str, "a string") or ""
    check = authoring.template_check(source=source, doc_format=_doc_format(data))
    return JsonResponse(check.to_json(), status=200 if check.parsed is not None else 400)


@api_endpoint("GET", "POST")
def template_versions(request: HttpRequest, slug: str) -> HttpResponse:
    _author(request)
    template = selectors.template_get(slug=slug)
    if request.method == "POST":
        data = json_body(request, allowed={"source", "doc_format", "title", "kind",
                                           "description", "publish"}, required={"source"})
        version = authoring.template_version_create(
            slug=template.slug, title=_typed(data, "title", str, "a string") or template.title,
            kind=_typed(data, "kind", str, "a string") or template.kind,
            description=_typed(data, "description", str, "a string") or template.description,
            source=_typed(data, "source", str, "a string") or "", user=request.user,
            doc_format=_doc_format(data),
            publish=bool(_typed(data, "publish", bool, "true or false")),
        )  # fmt: skip
        template.refresh_from_db()
        return JsonResponse({**_version_json(template, version),
                             "domain": authoring.template_version_domain(version=version)},
                            status=201)  # fmt: skip
    versions = [_version_json(template, v) for v in template.versions.order_by("-number")]
    return JsonResponse({"versions": versions, "published": getattr(
        template.published_version, "number", None)})  # fmt: skip


@api_endpoint("GET")
def template_version(request: HttpRequest, slug: str, number: int) -> HttpResponse:
    """One version; ``?against=M`` adds the unified diff from version M (default: the one
    before)."""
    _author(request)
    template = selectors.template_get(slug=slug)
    version = _version(template, number)
    against = request.GET.get("against")
    old = _version(template, against) if against else (
        template.versions.filter(number__lt=version.number).order_by("-number").first())
    return JsonResponse({**_version_json(template, version),
                         "against": old.number if old else None,
                         "diff": authoring.template_version_diff(old=old, new=version)})


@api_endpoint("POST")
def template_publish(request: HttpRequest, slug: str) -> HttpResponse:
    _author(request)
    template = selectors.template_get(slug=slug)
    data = json_body(request, allowed={"version"}, required={"version"})
    version = _version(template, _typed(data, "version", int, "a version number"))
    authoring.template_publish(template=template, version=version)
    return JsonResponse(_version_json(template, version))


@api_endpoint("POST")
def template_unpublish(request: HttpRequest, slug: str) -> HttpResponse:
    _author(request)
    template = selectors.template_get(slug=slug)
    json_body(request, allowed=set())
    authoring.template_unpublish(template=template)
    return JsonResponse({"slug": template.slug, "published": None})
