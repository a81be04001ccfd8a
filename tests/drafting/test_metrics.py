"""/metrics: the job histograms and counters, and review quality and cost by route."""

from __future__ import annotations

from typing import Any

from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from drafting import services
from drafting.models import Draft, Fragment, InfillJob
from tests.drafting.helpers import fill, provisional_draft


def _scrape(client: Client) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    body = client.get("/metrics").content.decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(body)
        for sample in family.samples
    }


def test_metrics_names_the_job_latencies_and_counters(client: Client, db: Any) -> None:
    names = {name for name, _ in _scrape(client)}
    # (a labelled family shows samples once a label set was observed, in the worker)
    for expected in ("stencil_request_queue_time_seconds_bucket",
                     "stencil_time_to_first_stable_text_seconds_bucket",
                     "stencil_validation_time_seconds_bucket", "stencil_fallbacks_total",
                     "stencil_cancellations_total"):  # fmt: skip
        assert expected in names


def test_correction_ratio_and_cost_per_accepted_result_by_route(
    client: Client, draft: Draft, user: Any
) -> None:
    provisional_draft(draft, user)
    InfillJob.objects.update(route="diffusion", attempts=[{"seconds": 1.5}, {"seconds": 0.5}])
    services.fragment_review(fragment=fill(draft, "reason"), action="accept", user=user)
    services.fragment_review(fragment=fill(draft, "urgency"), action="edit", user=user,
                             text="urgent")  # fmt: skip
    services.fragment_review(fragment=fill(draft, "summary"), action="reject", user=user)
    services.fragment_review(fragment=fill(draft, "summary"), action="edit", user=user,
                             text="Angina for two months.")  # fmt: skip
    draft.refresh_from_db()
    services.draft_accept(draft=draft, expected_revision=draft.revision, user=user)

    samples = _scrape(client)
    route = (("route", "diffusion"),)
    # reason accepted; urgency and summary edited by hand: 2 of 3 corrected
    assert samples[("stencil_user_correction_ratio", route)] == 2 / 3
    assert samples[("stencil_accelerator_seconds_per_accepted_result", route)] == 2.0
    assert Fragment.objects.filter(status=Fragment.Status.EDITED).count() == 2
