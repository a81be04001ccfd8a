"""Page URLs (namespace ``corpora``, under /corpora/) and JSON API URLs (namespace
``corpora_api``, under /api/v1/)."""

from __future__ import annotations

from django.urls import path

from corpora import api, views

app_name = "corpora"

urlpatterns = [
    path("", views.corpus_list, name="corpus_list"),
    path("<int:corpus_id>/", views.corpus_detail, name="corpus_detail"),
    path("<int:corpus_id>/upload/", views.corpus_upload, name="corpus_upload"),
    path("<int:corpus_id>/imports/<int:import_id>/", views.import_detail, name="import_detail"),
    path("<int:corpus_id>/documents/<int:document_id>/", views.document_detail,
         name="document_detail"),
    path("<int:corpus_id>/train/", views.corpus_train, name="corpus_train"),
    path("runs/<uuid:run_id>/", views.run_detail, name="run_detail"),
    path("runs/<uuid:run_id>/cancel/", views.run_cancel, name="run_cancel"),
    path("models/", views.model_versions, name="model_versions"),
    path("models/<int:version_id>/promote/", views.model_version_promote,
         name="model_version_promote"),
    path("models/rollback/", views.promotion_roll_back, name="promotion_roll_back"),
]  # fmt: skip

api_urlpatterns = (
    [
    path("corpora", api.corpora, name="corpora"),
    path("corpora/<int:corpus_id>", api.corpus_detail, name="corpus_detail"),
    path("corpora/<int:corpus_id>/documents", api.corpus_documents, name="corpus_documents"),
    path("corpora/<int:corpus_id>/documents/<int:document_id>", api.document_detail,
         name="corpus_document_detail"),
    path("corpora/<int:corpus_id>/train", api.corpus_train, name="corpus_train"),
    path("training-runs/<uuid:run_id>", api.training_run_detail, name="training_run_detail"),
    path("training-runs/<uuid:run_id>/cancel", api.training_run_cancel, name="training_run_cancel"),
    path("model-versions", api.model_versions, name="model_versions"),
    path("model-versions/<int:version_id>/promote", api.model_version_promote,
         name="model_version_promote"),
    path("model-versions/rollback", api.promotion_roll_back, name="promotion_roll_back"),
    ],
    "corpora_api",
)  # fmt: skip
