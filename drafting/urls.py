"""Page URLs (namespace ``drafting``) and JSON API URLs (namespace ``api``, under /api/v1/)."""

from __future__ import annotations

from django.urls import path

from drafting import api, api_reports, api_templates, editor, views

app_name = "drafting"

urlpatterns = [
    path("", views.home, name="home"),
    path("templates/<slug:slug>/new/", views.draft_new, name="draft_new"),
    path("drafts/<int:draft_id>/", views.draft_detail, name="draft_detail"),
    path("drafts/<int:draft_id>/values/", views.draft_values, name="draft_values"),
    path("drafts/<int:draft_id>/delete/", views.draft_delete, name="draft_delete"),
    path("drafts/<int:draft_id>/fill/", views.draft_fill, name="draft_fill"),
    path("drafts/<int:draft_id>/regenerate/", views.fragment_regenerate, name="fragment_regenerate"),
    path("drafts/<int:draft_id>/fragments/<int:fragment_id>/lock/", views.fragment_lock,
         name="fragment_lock"),
    path("drafts/<int:draft_id>/fragments/<int:fragment_id>/review/", views.fragment_review,
         name="fragment_review"),
    path("drafts/<int:draft_id>/fragments/<int:fragment_id>/report/", views.fragment_report,
         name="fragment_report"),
    path("drafts/<int:draft_id>/review/", views.draft_review, name="draft_review"),
    path("drafts/<int:draft_id>/accept/", views.draft_accept, name="draft_accept"),
    path("drafts/<int:draft_id>/export.<str:fmt>", views.draft_export, name="draft_export"),
    path("jobs/<uuid:job_id>/", views.job_detail, name="job_detail"),
    path("jobs/<uuid:job_id>/cancel/", views.job_cancel, name="job_cancel"),
    path("authoring/", editor.template_list, name="template_list"),
    path("authoring/new/", editor.template_edit, name="template_new"),
    path("authoring/preview/", editor.template_preview, name="template_preview"),
    path("authoring/<slug:slug>/", editor.template_edit, name="template_edit"),
    path("authoring/<slug:slug>/versions/<int:number>/", editor.template_version,
         name="template_version"),
    path("authoring/<slug:slug>/publish/", editor.template_publish, name="template_publish"),
    path("authoring/<slug:slug>/unpublish/", editor.template_unpublish,
         name="template_unpublish"),
    path("tokens/", views.tokens, name="tokens"),
    path("tokens/<int:token_id>/revoke/", views.token_revoke, name="token_revoke"),
]  # fmt: skip

api_urlpatterns = (
    [
        path("templates", api.templates, name="templates"),
        path("templates/preview", api_templates.template_preview, name="template_preview"),
        path("templates/<slug:slug>", api.template_detail, name="template_detail"),
        path("templates/<slug:slug>/versions", api_templates.template_versions,
             name="template_versions"),
        path("templates/<slug:slug>/versions/<int:number>", api_templates.template_version,
             name="template_version"),
        path("templates/<slug:slug>/publish", api_templates.template_publish,
             name="template_publish"),
        path("templates/<slug:slug>/unpublish", api_templates.template_unpublish,
             name="template_unpublish"),
        path("drafts", api.drafts, name="drafts"),
        path("drafts/<int:draft_id>", api.draft_detail, name="draft_detail"),
        path("drafts/<int:draft_id>/fragments/<int:fragment_id>/lock", api.fragment_lock,
             name="fragment_lock"),
        path("drafts/<int:draft_id>/fragments/<int:fragment_id>/review", api.fragment_review,
             name="fragment_review"),
        path("drafts/<int:draft_id>/fragments/<int:fragment_id>/regenerate",
             api.fragment_regenerate, name="fragment_regenerate"),
        path("drafts/<int:draft_id>/fragments/<int:fragment_id>/report", api_reports.fragment_report,
             name="fragment_report"),
        path("reports", api_reports.problem_reports, name="reports"),
        path("drafts/<int:draft_id>/infill", api.draft_infill, name="draft_infill"),
        path("drafts/<int:draft_id>/revisions", api.draft_revisions, name="draft_revisions"),
        path("drafts/<int:draft_id>/accept", api.draft_accept, name="draft_accept"),
        path("drafts/<int:draft_id>/export", api.draft_export, name="draft_export"),
        path("infill", api.infill, name="infill"),
        path("jobs", api.jobs, name="jobs"),
        path("jobs/<uuid:job_id>", api.job_detail, name="job_detail"),
        path("jobs/<uuid:job_id>/cancel", api.job_cancel, name="job_cancel"),
    ],
    "api",
)  # fmt: skip
