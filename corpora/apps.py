from __future__ import annotations

from django.apps import AppConfig


class CorporaConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "corpora"
    verbose_name = "corpora and model versions"
