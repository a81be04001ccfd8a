"""The OpenAPI 3.1 document of the JSON API, written by hand (served at /api/openapi.json)."""

from __future__ import annotations

from typing import Any

from drafting.docformat import DOC_FORMATS
from drafting.exports import DOCX_TYPE, EXPORT_FORMATS, EXPORT_WHICH
from drafting.models import ProblemReport

API_VERSION = "1.0.0"
REPORT_REASONS = list(ProblemReport.Reason.values)
DOC_FORMAT = {"type": "string", "enum": list(DOC_FORMATS), "default": "text"}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _errors(*codes: int) -> dict[str, Any]:
    text = {
        400: "Bad input: wrong types, unknown fields, invalid values",
        413: "Too large: a body over 1 MB, or a canvas over STENCIL_MAX_CANVAS_CHARS of text",
        401: "No or invalid credentials",
        403: "CSRF check failed (session writes) or not allowed",
        404: "Absent, or another person's",
        409: "Compare-and-set lost: the draft changed or was already accepted",
        429: "Admission control: too much queued work; see Retry-After",
    }
    responses: dict[str, Any] = {}
    for code in [*codes, *([413] if 400 in codes else [])]:
        response = _json(_ref("Error"), text[code])
        if code == 429:
            response["headers"] = {
                "Retry-After": {"description": "seconds to wait", "schema": {"type": "integer"}}
            }
        responses[str(code)] = response
    return responses


def _body(schema: dict[str, Any]) -> dict[str, Any]:
    return {"required": True, "content": {"application/json": {"schema": schema}}}


def _op(summary: str, ok: dict[str, Any], *codes: int, body: dict[str, Any] | None = None,
        params: list[dict[str, Any]] | None = None, status: str = "200") -> dict[str, Any]:  # fmt: skip
    op: dict[str, Any] = {
        "summary": summary,
        "responses": {status: ok, **_errors(401, *codes)},
    }
    if body is not None:
        op["requestBody"] = _body(body)
    if params:
        op["parameters"] = params
    return op


def _path_param(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": schema}


CONFIDENCE = {  # a span's confidence (docs/confidence.md)
    "type": "object",
    "properties": {
        "p": {"type": "number", "minimum": 0, "maximum": 1}, "low": {"type": "boolean"},
        "marks": {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}},
        "signal": {"type": "string"}, "calibrated": {"type": "boolean"},
    },
}  # fmt: skip
DOMAIN = {  # the locked text against the training corpus; null when the model has no profile
    "type": ["object", "null"],
    "properties": {
        "score": {"type": "number"}, "unfamiliar": {"type": "boolean"},
        "threshold": {"type": "number"}, "warning": {"type": "string"},
    },
}  # fmt: skip
DRAFT_ID = _path_param("draft_id", {"type": "integer"})
SLUG = _path_param("slug", {"type": "string"})
FRAGMENT_ID = _path_param("fragment_id", {"type": "integer"})
JOB_ID = _path_param("job_id", {"type": "string", "format": "uuid"})
PRESET = {"type": "string", "enum": ["fast", "balanced", "careful"], "default": "balanced"}


def _object(properties: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    schema: dict[str, Any] = {
        "type": "object", "properties": properties, "additionalProperties": False,
    }  # fmt: skip
    if required:
        schema["required"] = required
    return schema


SCHEMAS: dict[str, Any] = {
    "Error": {
        "type": "object",
        "required": ["error", "errors"],
        "properties": {
            "error": {"type": "string", "description": "what went wrong, for a person"},
            "errors": {"type": "object", "additionalProperties": {"type": "string"},
                       "description": "a message per field"},
        },
    },  # fmt: skip
    "Template": {
        "type": "object",
        "properties": {
            "slug": {"type": "string"}, "title": {"type": "string"}, "kind": {"type": "string"},
            "description": {"type": "string"}, "version": {"type": "integer"},
            "fields": {"type": "array", "items": {"type": "object"}},
            "holes": {"type": "array", "items": {"type": "object"}},
            "route_hint": {"type": "string", "enum": ["auto", "diffusion", "ar"]},
            "source": {"type": "string"},
        },
    },  # fmt: skip
    "Fragment": {
        "type": "object",
        "properties": {
            "id": {"type": "integer"}, "position": {"type": "integer"},
            "kind": {"type": "string", "enum": ["text", "field", "fill"]},
            "name": {"type": "string"}, "label": {"type": "string"}, "hint": {"type": "string"},
            "text": {"type": "string"}, "locked": {"type": "boolean"},
            "status": {"type": "string", "enum": ["empty", "provisional", "accepted", "edited",
                                                   "rejected", "fixed"]},
            "provisional": {"type": "boolean",
                            "description": "model output a person has not accepted"},
            "confidence": {"type": ["object", "null"],
                           "description": "the model's confidence in this text: p (0..1), low "
                           "(flagged: likely a guess), marks ([start, end) character ranges it "
                           "was least sure of), signal, calibrated; null: not measured"},
            "written_by": {"type": "string", "enum": ["", "model", "person"]},
        },
    },  # fmt: skip
    "Revision": {
        "type": "object",
        "properties": {
            "number": {"type": "integer"}, "reason": {"type": "string"},
            "accepted": {"type": "boolean"}, "created": {"type": "string", "format": "date-time"},
            "text": {"type": "string"},
        },
    },  # fmt: skip
    "Draft": {
        "type": "object",
        "properties": {
            "id": {"type": "integer"}, "title": {"type": "string"},
            "template": {"type": "string"}, "template_version": {"type": "integer"},
            "revision": {"type": "integer",
                         "description": "bumps on every change; send it to accept"},
            "values": {"type": "object"},
            "fields": {"type": "array", "items": {"type": "object"}},
            "fragments": {"type": "array", "items": _ref("Fragment")},
            "has_provisional": {"type": "boolean"},
            "accepted_revision": {"oneOf": [_ref("Revision"), {"type": "null"}]},
            "latest_job": {"oneOf": [_ref("JobSummary"), {"type": "null"}]},
        },
    },  # fmt: skip
    "DraftSummary": {
        "type": "object",
        "properties": {
            "id": {"type": "integer"}, "title": {"type": "string"},
            "template": {"type": "string"}, "revision": {"type": "integer"},
            "accepted": {"type": "boolean"},
        },
    },  # fmt: skip
    "JobSummary": {
        "type": "object",
        "properties": {
            "id": {"type": "string", "format": "uuid"},
            "state": {"type": "string", "enum": ["queued", "running", "validating", "succeeded",
                                                  "failed", "cancelled"]},
            "final": {"type": "boolean"}, "draft": {"type": ["integer", "null"]},
            "preset": {"type": "string"},
        },
    },  # fmt: skip
    "Job": {
        "allOf": [_ref("JobSummary")],
        "type": "object",
        "properties": {
            "queue_position": {"type": "integer", "description": "queued jobs ahead (0 = next)"},
            "progress": {
                "type": "object",
                "properties": {
                    "attempt": {"type": "integer"}, "step": {"type": "integer"},
                    "max_steps": {"type": "integer"}, "committed": {"type": "integer"},
                    "positions": {"type": "integer"}, "committed_share": {"type": "number"},
                    "holes": {"type": "object", "additionalProperties": {
                        "type": "object",
                        "properties": {"stable": {"type": "string"},
                                       "provisional": {"type": "string"}}}},
                    "provisional": {"const": True},
                },
            },
            "result": {"oneOf": [{"type": "null"}, {
                "type": "object",
                "properties": {
                    "provisional": {"const": True,
                                    "description": "model output, not accepted by a person"},
                    "holes": {"type": "object", "additionalProperties": {"type": "string"}},
                    "document": {"type": "string"},
                    "violations": {"type": "array"},
                    "run_id": {"type": "string"},
                    "confidence": {"type": "object", "additionalProperties": CONFIDENCE,
                                   "description": "per hole: P(right) for the route that wrote it"},
                    "domain": DOMAIN,
                    "needs_person": {"type": "boolean",
                                     "description": "every route's result had a low span"},
                    "model_version": _object({
                        "id": {"type": ["integer", "null"]}, "name": {"type": "string"},
                        "scope": {"type": "string", "description":
                                  '"template:<slug>", "default" or "configured"'},
                        "weights_sha256": {"type": "string"}}),
                    "config": {"type": "object", "description":
                               "the sampler config that ran: the requested one fitted to the "
                               "model (a block-diffusion model runs cache \"block\")"},
                    "config_sha256": {"type": "string",
                                      "description": "sha256 of the config that ran"},
                },
            }]},
            "config_sha256": {"type": "string", "description": "sha256 of the requested config"},
            "requested_config": {"type": "object",
                                 "description": "the sampler config frozen when the job was made"},
            "written_by": {"type": ["string", "null"],
                           "description": "the model version that wrote the result, in words"},
            "config_note": {"type": "string",
                            "description": "the config that ran and the requested one, in words"},
            "reasons": {"type": "array", "items": {"type": "string"},
                        "description": "why the job failed or was cancelled"},
            "cancel_requested": {"type": "boolean"},
        },
    },  # fmt: skip
    "TemplateCheck": {
        "type": "object",
        "properties": {
            "ok": {"type": "boolean"},
            "errors": {"type": "array", "items": _object({
                "message": {"type": "string"}, "line": {"type": "integer"},
                "column": {"type": "integer"}})},
            "fields": {"type": "array"}, "holes": {"type": "array"},
            "pieces": {"type": "array"},
            "document_schema": {"type": ["object", "null"]},
            "domain": DOMAIN,
        },
    },  # fmt: skip
    "ProblemReport": {
        "type": "object",
        "properties": {
            "id": {"type": "integer"}, "draft": {"type": "integer"},
            "fragment": {"type": ["integer", "null"]}, "span": {"type": "string"},
            "reason": {"type": "string", "enum": REPORT_REASONS}, "note": {"type": "string"},
            "incident": {"type": "integer"},
            "status": {"type": "string", "enum": ["open", "investigating", "resolved",
                                                  "dismissed"]},
            "created": {"type": "string", "format": "date-time"},
        },
    },  # fmt: skip
    "Canvas": {
        "type": "object",
        "description": "Canvas JSON: text segments are locked, holes are filled by the model.",
        "required": ["segments"],
        "additionalProperties": False,
        "properties": {
            "segments": {"type": "array", "minItems": 1, "items": {"oneOf": [
                _object({"text": {"type": "string"}}, ["text"]),
                _object({
                    "hole": {"type": "string"},
                    "max_tokens": {"type": "integer", "minimum": 1, "maximum": 256},
                    "hint": {"type": "string", "maxLength": 500,
                             "description": "what the hole holds (an instruct model reads it)"},
                    "constraint": _object({
                        "pattern": {"type": "string"},
                        "choices": {"type": "array", "items": {"type": "string"}},
                        "schema": {"type": "object"},
                    }),
                }, ["hole", "max_tokens"]),
            ]}},
            "seed": {"type": "integer", "minimum": 0},
            "sampler": {"type": "object", "description": "SamplerConfig overrides"},
            "purpose": {"type": "string", "maxLength": 2000,
                        "description": "what the document is for (an instruct model reads it)"},
            "preset": PRESET,
        },
    },  # fmt: skip
}


def openapi_spec() -> dict[str, Any]:
    draft_ok = _json(_ref("Draft"), "The draft")
    job_ok = _json(_ref("Job"), "The job (model text in it is provisional)")
    fragment_ok = _json(_ref("Fragment"), "The fragment")
    paths: dict[str, Any] = {
        "/api/v1/templates": {
            "get": _op("Document templates (latest versions)", _json(_object(
                {"templates": {"type": "array", "items": _ref("Template")}}), "Templates")),
            "post": _op("Save a template's next version and publish it unless publish is "
                        "false (template authors)",
                        _json(_ref("Template"), "The saved version"), 400, 403, status="201",
                        body=_object({
                            "slug": {"type": "string"}, "title": {"type": "string"},
                            "kind": {"type": "string"}, "source": {"type": "string"},
                            "description": {"type": "string"},
                            "route_hint": {"type": "string", "enum": ["auto", "diffusion", "ar"]},
                            "doc_format": DOC_FORMAT, "publish": {"type": "boolean"},
                        }, ["slug", "title", "kind", "source"])),
        },
        "/api/v1/templates/{slug}": {
            "get": _op("One template with its source", _json(_ref("Template"), "The template"),
                       404, params=[_path_param("slug", {"type": "string"})]),
        },
        "/api/v1/templates/preview": {
            "post": _op("Check a template source (template authors): what it makes, or its "
                        "error with line and column", _json(_ref("TemplateCheck"), "Valid"),
                        400, 403, body=_object({"source": {"type": "string"},
                                                "doc_format": DOC_FORMAT}, ["source"])),
        },
        "/api/v1/templates/{slug}/versions": {
            "get": _op("A template's versions, newest first (template authors)", _json(_object({
                "versions": {"type": "array", "items": _ref("Template")},
                "published": {"type": ["integer", "null"]}}), "Versions"), 403, 404,
                params=[SLUG]),
            "post": _op("Save the next version (unpublished unless publish is true)",
                        _json(_ref("Template"), "The saved version"), 400, 403, 404,
                        status="201", params=[SLUG], body=_object({
                            "source": {"type": "string"}, "doc_format": DOC_FORMAT,
                            "title": {"type": "string"}, "kind": {"type": "string"},
                            "description": {"type": "string"}, "publish": {"type": "boolean"},
                        }, ["source"])),
        },
        "/api/v1/templates/{slug}/versions/{number}": {
            "get": _op("One version and the unified diff from ?against=M (default: the one "
                       "before)", _json(_ref("Template"), "The version with diff"), 403, 404,
                       params=[SLUG, _path_param("number", {"type": "integer"}),
                               {"name": "against", "in": "query",
                                "schema": {"type": "integer"}}]),
        },
        "/api/v1/templates/{slug}/publish": {
            "post": _op("Publish a version: new drafts use it", _json(_ref("Template"), "It"),
                        400, 403, 404, params=[SLUG],
                        body=_object({"version": {"type": "integer"}}, ["version"])),
        },
        "/api/v1/templates/{slug}/unpublish": {
            "post": _op("Unpublish: nobody starts a new draft of it", _json(_object({
                "slug": {"type": "string"}, "published": {"type": "null"}}), "Unpublished"),
                403, 404, params=[SLUG]),
        },
        "/api/v1/drafts": {
            "get": _op("My drafts", _json(_object(
                {"drafts": {"type": "array", "items": _ref("DraftSummary")}}), "Drafts")),
            "post": _op("Make a draft from a template and field values",
                        _json(_ref("Draft"), "The new draft"), 400, 404, status="201",
                        body=_object({"template": {"type": "string", "minLength": 1}, "values": {"type": "object"},
                                      "title": {"type": "string"}}, ["template"])),
        },
        "/api/v1/drafts/{draft_id}": {
            "get": _op("A draft with its fragments", draft_ok, 404, params=[DRAFT_ID]),
            "patch": _op("Save field values (autosave); all are validated first", draft_ok,
                         400, 404, params=[DRAFT_ID],
                         body=_object({"values": {"type": "object"}}, ["values"])),
            "delete": _op("Delete the draft with its revisions and jobs (not while an "
                          "infill runs: 409)", {"description": "Deleted"}, 404, 409,
                          status="204", params=[DRAFT_ID]),
        },
        "/api/v1/drafts/{draft_id}/fragments/{fragment_id}/lock": {
            "post": _op("Lock or unlock a fragment", fragment_ok, 400, 404,
                        params=[DRAFT_ID, FRAGMENT_ID],
                        body=_object({"locked": {"type": "boolean"}}, ["locked"])),
        },
        "/api/v1/drafts/{draft_id}/fragments/{fragment_id}/review": {
            "post": _op("Accept, reject, edit or write a span (a span flagged low-confidence "
                        "is accepted only with accept_anyway)", fragment_ok, 400, 404,
                        params=[DRAFT_ID, FRAGMENT_ID],
                        body=_object({"action": {"type": "string",
                                                 "enum": ["accept", "reject", "edit", "write"]},
                                      "text": {"type": "string"},
                                      "accept_anyway": {"type": "boolean"}}, ["action"])),
        },
        "/api/v1/drafts/{draft_id}/fragments/{fragment_id}/regenerate": {
            "post": _op("Regenerate a fragment, or characters [start, end) of it", job_ok,
                        400, 404, 429, status="202", params=[DRAFT_ID, FRAGMENT_ID],
                        body=_object({"start": {"type": "integer"}, "end": {"type": "integer"},
                                      "preset": PRESET,
                                      "variation": {"type": "string",
                                                    "enum": ["small", "medium", "large"]}})),
        },
        "/api/v1/drafts/{draft_id}/fragments/{fragment_id}/report": {
            "post": _op("Report a problem with a model-written span: opens an audit incident",
                        _json(_ref("ProblemReport"), "The report"), 400, 404, status="201",
                        params=[DRAFT_ID, FRAGMENT_ID],
                        body=_object({"reason": {"type": "string", "enum": REPORT_REASONS},
                                      "note": {"type": "string", "maxLength": 1000}},
                                     ["reason"])),
        },
        "/api/v1/reports": {
            "get": _op("My problem reports with their incidents' status", _json(_object(
                {"reports": {"type": "array", "items": _ref("ProblemReport")}}), "Reports")),
        },
        "/api/v1/drafts/{draft_id}/infill": {
            "post": _op("Fill every unlocked fragment (or the listed ones)", job_ok,
                        400, 404, 429, status="202", params=[DRAFT_ID],
                        body=_object({"preset": PRESET, "fragments": {
                            "type": "array", "items": {"type": "integer"}}})),
        },
        "/api/v1/drafts/{draft_id}/revisions": {
            "get": _op("Revisions, newest first, and a diff of the newest two", _json(_object({
                "revisions": {"type": "array", "items": _ref("Revision")},
                "diff": {"type": "string"}}), "Revisions"), 404, params=[DRAFT_ID]),
        },
        "/api/v1/drafts/{draft_id}/accept": {
            "post": _op("Accept the draft (compare-and-set on its revision number)",
                        _json(_ref("Revision"), "The immutable accepted revision"),
                        400, 404, 409, params=[DRAFT_ID],
                        body=_object({"revision": {"type": "integer"}}, ["revision"])),
        },
        "/api/v1/drafts/{draft_id}/export": {
            "get": _op("Export the draft's text: clean when it is the accepted revision, "
                       "marked (PDF and Word: watermarked DRAFT) otherwise", {
                "description": "The document",
                "content": {"text/plain": {"schema": {"type": "string"}},
                            "text/markdown": {"schema": {"type": "string"}},
                            "application/pdf": {"schema": {"type": "string",
                                                           "format": "binary"}},
                            DOCX_TYPE: {"schema": {"type": "string", "format": "binary"}}},
            }, 400, 404, params=[DRAFT_ID, {"name": "format", "in": "query",
                                            "schema": {"type": "string",
                                                       "enum": list(EXPORT_FORMATS),
                                                       "default": "txt"}},
                                 {"name": "which", "in": "query", "description":
                                  "current text, or the last accepted revision",
                                  "schema": {"type": "string", "enum": list(EXPORT_WHICH),
                                             "default": "current"}}]),
        },
        "/api/v1/infill": {
            "post": _op("Ad-hoc infill of Canvas JSON, without a template", job_ok, 400, 429,
                        status="202", body=_ref("Canvas")),
        },
        "/api/v1/jobs": {
            "get": _op("My recent jobs", _json(_object(
                {"jobs": {"type": "array", "items": _ref("JobSummary")}}), "Jobs")),
        },
        "/api/v1/jobs/{job_id}": {
            "get": _op("A job's state, progress and (provisional) result", job_ok, 404,
                       params=[JOB_ID]),
        },
        "/api/v1/jobs/{job_id}/cancel": {
            "post": _op("Cancel: a queued job ends now, a running one at its next step", job_ok,
                        404, params=[JOB_ID]),
        },
    }  # fmt: skip
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Stencil API",
            "version": API_VERSION,
            "description": (
                "Constrained document drafting with a block-diffusion language model. "
                "Model output is provisional until a person accepts it. Errors are "
                '{"error": message, "errors": {field: message}}.'
            ),
        },
        "servers": [{"url": "/"}],
        "security": [{"token": []}, {"session": []}],
        "components": {
            "securitySchemes": {
                "token": {"type": "apiKey", "in": "header", "name": "Authorization",
                          "description": "Authorization: Token <key> (make keys at /tokens/)"},
                "session": {"type": "apiKey", "in": "cookie", "name": "sessionid",
                            "description": "The pages' session; writes need X-CSRFToken"},
            },  # fmt: skip
            "schemas": SCHEMAS,
        },
        "paths": paths,
    }
