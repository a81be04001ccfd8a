"""What the web app tells the apps above it, without importing them.

``draft_accepted`` is sent once the transaction that accepted a draft has committed, with
``draft``, ``revision`` (the accepted DraftRevision) and ``user``. Receivers run with
``send_robust``: one that fails is logged and never undoes or fails the acceptance.
"""

from __future__ import annotations

from django.dispatch import Signal

draft_accepted = Signal()
