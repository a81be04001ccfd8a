from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import HttpRequest


def stencil(request: HttpRequest) -> dict[str, Any]:
    """Which model the workers load, so pages can say when it is an untrained placeholder."""
    directory = settings.STENCIL_MODEL_DIR
    return {
        "stencil_model_name": directory.name,
        "stencil_model_placeholder": directory.name == "stencil-placeholder",
    }
