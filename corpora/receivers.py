"""Learning from review: an accepted draft of a template with an enabled ReviewFeed becomes a
document of the feed's corpus (encrypted, deduplicated, with a per-file report, as an upload)."""

from __future__ import annotations

import logging
from typing import Any

from django.db.models import F

from corpora.models import ReviewFeed
from corpora.services import corpus_import

log = logging.getLogger(__name__)


def review_feed_on_accept(*, draft: Any, revision: Any, user: Any, **_: Any) -> int:
    """Add the accepted text to the template's review corpus; the number of documents added."""
    template_id = draft.template_version.template_id
    feed = ReviewFeed.objects.filter(template_id=template_id, enabled=True).first()
    if feed is None or not revision.text.strip():
        return 0
    name = f"review/{draft.template_version.template.slug}/draft-{draft.pk}-r{revision.number}.txt"
    outcome = corpus_import(corpus=feed.corpus, user=user, files=[(name, revision.text.encode())])
    if outcome.added:
        ReviewFeed.objects.filter(pk=feed.pk).update(documents_added=F("documents_added") + 1)
        log.info("accepted draft %s added to corpus %s", draft.pk, feed.corpus_id)
    return len(outcome.added)
