"""Root URLconf: admin, accounts, the pages, the JSON API and its OpenAPI document, ops."""

from __future__ import annotations

import os

from django.contrib import admin
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import include, path
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client import REGISTRY as DEFAULT_REGISTRY
from prometheus_client.multiprocess import MultiProcessCollector

from corpora.urls import api_urlpatterns as corpora_api_urlpatterns
from drafting import api
from drafting import metrics as _metrics  # registers Stencil's metrics
from drafting.urls import api_urlpatterns


@never_cache
@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    """Prometheus text format; aggregates every process's files in multiprocess mode."""
    registry: CollectorRegistry = DEFAULT_REGISTRY
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        MultiProcessCollector(registry)
    body = generate_latest(registry) + generate_latest(_metrics.REVIEW_REGISTRY)
    return HttpResponse(body, content_type=CONTENT_TYPE_LATEST)


@never_cache
@require_GET
def healthz(request: HttpRequest) -> HttpResponse:
    """Liveness and database reachability, for load balancers and ``up``."""
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except Exception as exc:  # any database failure means "not healthy", with the reason
        return JsonResponse({"ok": False, "database": str(exc)}, status=503)
    return JsonResponse({"ok": True, "database": "ok"})


urlpatterns = [
    path("admin/", admin.site.urls),
    path("accounts/", include("django.contrib.auth.urls")),
    path("metrics", metrics, name="metrics"),
    path("healthz", healthz, name="healthz"),
    path("api/openapi.json", api.openapi_document, name="openapi"),
    path("api/v1/", include(api_urlpatterns)),
    path("api/v1/", include(corpora_api_urlpatterns)),
    path("corpora/", include("corpora.urls")),
    path("", include("drafting.urls")),
]
