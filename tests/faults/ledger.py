"""Counting what faults did to a set of jobs: lost, duplicated, stuck (shared with the bench).

- stuck: not final by the deadline;
- lost: final but not succeeded (every job these tests submit is valid, and nobody cancels),
  its row gone, or succeeded without its result in its draft (no infill revision);
- duplicated: a draft with more infill revisions, or more succeeded jobs, than one per job it
  asked for (a result applied twice).
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from drafting.models import DraftRevision, InfillJob


@dataclass
class Tally:
    jobs: int
    lost: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    stuck: list[str] = field(default_factory=list)
    finished: dict[str, datetime] = field(default_factory=dict)  # job id -> when it ended

    @property
    def clean(self) -> bool:
        return not (self.lost or self.duplicated or self.stuck)

    def as_json(self) -> dict[str, Any]:
        return {"jobs": self.jobs, "lost": len(self.lost), "duplicated": len(self.duplicated),
                "stuck": len(self.stuck)}  # fmt: skip

    def __str__(self) -> str:
        return (f"{self.jobs} jobs: lost {self.lost}, duplicated {self.duplicated}, "
                f"stuck {self.stuck}")  # fmt: skip


def settle(job_ids: list[str], *, deadline_s: float, interval: float = 0.25) -> Tally:
    """Wait until every job is final (or the deadline passes), then count."""
    ids = [str(i) for i in job_ids]
    until = time.monotonic() + deadline_s
    while time.monotonic() < until:
        left = InfillJob.objects.filter(pk__in=ids).exclude(state__in=InfillJob.FINAL_STATES)
        if not left.exists():
            break
        time.sleep(interval)
    return tally(ids)


def tally(job_ids: list[str]) -> Tally:
    ids = [str(i) for i in job_ids]
    jobs = {str(j.pk): j for j in InfillJob.objects.filter(pk__in=ids)}
    result = Tally(jobs=len(ids))
    for pk in ids:
        job = jobs.get(pk)
        if job is None:
            result.lost.append(pk)
        elif not job.is_final:
            result.stuck.append(pk)
        elif job.state != InfillJob.State.SUCCEEDED:
            result.lost.append(f"{pk} ({job.state}: {'; '.join(job.reasons)[:200]})")
        if job is not None and job.finished is not None:
            result.finished[pk] = job.finished
    asked = Counter(j.draft_id for j in jobs.values() if j.draft_id is not None)
    succeeded = Counter(j.draft_id for j in jobs.values()
                        if j.draft_id is not None and j.state == InfillJob.State.SUCCEEDED)  # fmt: skip
    revisions = Counter(
        DraftRevision.objects.filter(draft_id__in=list(asked), reason="infill")
        .values_list("draft_id", flat=True)
    )  # fmt: skip
    for draft_id, n in asked.items():
        if revisions[draft_id] > n or succeeded[draft_id] > n:
            result.duplicated.append(f"draft {draft_id}: {revisions[draft_id]} infill revisions, "
                                     f"{succeeded[draft_id]} succeeded jobs for {n} asked")  # fmt: skip
        for pk, job in jobs.items():
            if (job.draft_id == draft_id and job.state == InfillJob.State.SUCCEEDED
                    and revisions[draft_id] == 0):  # fmt: skip
                result.lost.append(f"{pk} (succeeded, but its draft has no infill revision)")
    return result
