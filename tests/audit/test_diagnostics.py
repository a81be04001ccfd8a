"""Encrypted diagnostics: round trip, tamper failure, key rotation, auditor-only audited reads."""

from __future__ import annotations

import datetime as dt
import io
from typing import Any

import pytest
from django.contrib.auth.models import Group
from django.core.exceptions import PermissionDenied
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

from audit.crypto import DecryptionError
from audit.models import AuditEvent, Diagnostic
from audit.selectors import log_verify
from audit.services import checkpoint_write, diagnostic_decrypt, diagnostic_read, keys_rotate
from tests.audit.conftest import SNAPSHOT_MARKER, b64_key


@pytest.fixture
def auditor(django_user_model: Any) -> Any:
    user = django_user_model.objects.create_user(username="audrey", password="pw-audrey-123")
    user.groups.add(Group.objects.get_or_create(name="auditors")[0])
    return user


@pytest.fixture
def clerk(django_user_model: Any) -> Any:
    return django_user_model.objects.create_user(
        username="carl", password="pw-carl-123", is_staff=True
    )


def _snapshots() -> list[str]:
    return [f"{SNAPSHOT_MARKER} step {i}" for i in range(3)]


def _set_bytes(diagnostic: Diagnostic, column: str, value: bytes) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE audit_diagnostic SET {column} = %s WHERE id = %s",  # noqa: S608
            [value, diagnostic.pk],
        )


def test_auditor_reads_the_drafts_back(record_fake: Any, auditor: Any) -> None:
    run = record_fake()
    assert diagnostic_read(diagnostic=run.diagnostics.get(), user=auditor) == _snapshots()


def test_superuser_may_read(record_fake: Any, admin_user: Any) -> None:
    run = record_fake()
    assert diagnostic_read(diagnostic=run.diagnostics.get(), user=admin_user) == _snapshots()


def test_each_read_is_itself_audited(record_fake: Any, auditor: Any) -> None:
    diagnostic = record_fake().diagnostics.get()
    diagnostic_read(diagnostic=diagnostic, user=auditor)
    event = AuditEvent.objects.get(kind=AuditEvent.Kind.DIAGNOSTIC_READ)
    assert (event.actor, event.subject) == ("audrey", f"diagnostic:{diagnostic.pk}")
    checkpoint_write()
    assert log_verify().ok


def test_non_auditor_is_refused_and_the_attempt_audited(record_fake: Any, clerk: Any) -> None:
    diagnostic = record_fake().diagnostics.get()
    with pytest.raises(PermissionDenied):
        diagnostic_read(diagnostic=diagnostic, user=clerk)
    event = AuditEvent.objects.get(kind=AuditEvent.Kind.DIAGNOSTIC_READ_DENIED)
    assert event.actor == "carl"
    assert not AuditEvent.objects.filter(kind=AuditEvent.Kind.DIAGNOSTIC_READ).exists()


def test_ciphertext_is_not_the_plaintext(record_fake: Any) -> None:
    diagnostic = record_fake().diagnostics.get()
    assert SNAPSHOT_MARKER.encode() not in bytes(diagnostic.ciphertext)


@pytest.mark.parametrize("column", ["ciphertext", "nonce"])
def test_tampered_ciphertext_or_nonce_fails_to_decrypt(record_fake: Any, column: str) -> None:
    diagnostic = record_fake().diagnostics.get()
    data = bytearray(bytes(getattr(diagnostic, column)))
    data[len(data) // 2] ^= 0x01
    _set_bytes(diagnostic, column, bytes(data))
    with pytest.raises(DecryptionError):
        diagnostic_decrypt(diagnostic=Diagnostic.objects.get(pk=diagnostic.pk))


def test_ciphertext_moved_to_another_run_fails_to_decrypt(record_fake: Any) -> None:
    """The run id is the associated data: a swapped ciphertext does not authenticate."""
    a = record_fake(correlation_id="a").diagnostics.get()
    b = record_fake(correlation_id="b").diagnostics.get()
    _set_bytes(a, "ciphertext", bytes(b.ciphertext))
    _set_bytes(a, "nonce", bytes(b.nonce))
    with pytest.raises(DecryptionError):
        diagnostic_decrypt(diagnostic=Diagnostic.objects.get(pk=a.pk))


def test_drafts_survive_key_rotation_and_the_old_key_can_go(
    record_fake: Any, audit_settings: Any
) -> None:
    old = record_fake().diagnostics.get()
    new_key = b64_key(b"key-two")
    audit_settings.AUDIT_ENCRYPTION_KEYS = [new_key, *audit_settings.AUDIT_ENCRYPTION_KEYS]
    out = io.StringIO()
    call_command("audit_rotate_keys", stdout=out)
    assert "re-encrypted 1 diagnostic(s)" in out.getvalue()
    audit_settings.AUDIT_ENCRYPTION_KEYS = [new_key]  # retire the old key
    rotated = Diagnostic.objects.get(pk=old.pk)
    assert rotated.key_id != old.key_id
    assert diagnostic_decrypt(diagnostic=rotated) == _snapshots()
    assert AuditEvent.objects.filter(kind=AuditEvent.Kind.KEYS_ROTATED).exists()
    checkpoint_write()
    assert log_verify().ok, [str(f) for f in log_verify().findings]


def test_rotation_is_idempotent(record_fake: Any) -> None:
    record_fake()
    assert keys_rotate().reencrypted == 0


def test_unknown_key_id_is_a_clear_error(record_fake: Any, audit_settings: Any) -> None:
    diagnostic = record_fake().diagnostics.get()
    audit_settings.AUDIT_ENCRYPTION_KEYS = [b64_key(b"unrelated")]
    with pytest.raises(DecryptionError, match="not among the configured"):
        diagnostic_decrypt(diagnostic=diagnostic)


def test_purge_deletes_only_old_diagnostics_and_verify_accepts_it(
    record_fake: Any, audit_settings: Any
) -> None:
    old = record_fake(correlation_id="old").diagnostics.get()
    fresh = record_fake(correlation_id="fresh").diagnostics.get()
    with connection.cursor() as cursor:  # age the first one (as time would)
        cursor.execute(
            "UPDATE audit_diagnostic SET created = %s WHERE id = %s",
            [timezone.now() - dt.timedelta(days=40), old.pk],
        )
    out = io.StringIO()
    call_command("audit_purge_diagnostics", stdout=out)
    assert "purged 1 diagnostic(s)" in out.getvalue()
    assert list(Diagnostic.objects.values_list("pk", flat=True)) == [fresh.pk]
    event = AuditEvent.objects.get(kind=AuditEvent.Kind.DIAGNOSTICS_PURGED)
    assert str(old.pk) in event.details
    checkpoint_write()
    report = log_verify()
    assert report.ok, [str(f) for f in report.findings]
