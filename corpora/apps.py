from __future__ import annotations

from django.apps import AppConfig


class CorporaConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "corpora"
    verbose_name = "corpora and model versions"

    def ready(self) -> None:
        from corpora.receivers import review_feed_on_accept
        from drafting.signals import draft_accepted

        draft_accepted.connect(review_feed_on_accept, dispatch_uid="corpora.review_feed")
