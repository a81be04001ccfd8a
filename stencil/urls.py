"""Root URLconf: admin, accounts, the pages, the JSON API and its OpenAPI document, ops."""

from __future__ import annotations

import hmac
import ipaddress
import os

from django.conf import settings
from django.contrib import admin
from django.db import connection
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.urls import include, path
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from django.views.defaults import page_not_found as default_page_not_found
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
    """Prometheus text format; aggregates every process's files in multiprocess mode.

    Only for scrapers the operator named: a client address in ``STENCIL_METRICS_ALLOW``
    (addresses or networks; loopback by default) or ``Authorization: Bearer`` with
    ``STENCIL_METRICS_TOKEN``. Anyone else gets 403.
    """
    if not _metrics_allowed(request):
        return HttpResponse("metrics are for the operator's scrapers\n", status=403,
                            content_type="text/plain")  # fmt: skip
    registry: CollectorRegistry = DEFAULT_REGISTRY
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        MultiProcessCollector(registry)
    body = generate_latest(registry) + generate_latest(_metrics.REVIEW_REGISTRY)
    return HttpResponse(body, content_type=CONTENT_TYPE_LATEST)


def _metrics_allowed(request: HttpRequest) -> bool:
    token = str(settings.STENCIL_METRICS_TOKEN or "")
    given = request.headers.get("Authorization", "")
    if token and hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
        return True
    try:
        client = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
    except ValueError:
        return False
    return any(client in ipaddress.ip_network(net, strict=False)
               for net in settings.STENCIL_METRICS_ALLOW)  # fmt: skip


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


def page_not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """A 404 in the API's form under /api/ (JSON a client can read), Django's page elsewhere."""
    if request.path.startswith("/api/"):
        return JsonResponse(
            {"error": f"no API endpoint or object at {request.path}", "errors": {}},
            status=404,
        )
    return default_page_not_found(request, exception or Http404())


handler404 = page_not_found
