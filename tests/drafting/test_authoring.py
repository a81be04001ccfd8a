"""Template authors through the API: check, version, compare, publish; others may not."""

from __future__ import annotations

import json
from typing import Any

from django.test import Client

from drafting.auth import api_token_create
from drafting.management.commands.load_demo import template_authors_group
from tests.drafting.helpers import REFERRAL_SOURCE, VALUES


def post(client: Client, url: str, body: Any) -> Any:
    return client.post(url, json.dumps(body), content_type="application/json")


def author_client(user: Any) -> Client:
    user.groups.add(template_authors_group())
    return Client(HTTP_AUTHORIZATION=f"Token {api_token_create(user=user, name='a')[1]}")


def test_a_source_with_an_error_is_answered_with_its_line_and_column(user: Any) -> None:
    client = author_client(user)
    answer = post(client, "/api/v1/templates/preview",
                  {"source": 'Hi {{ field("a") }}\n  {% for x in y %}{% endfor %}'})
    assert answer.status_code == 400
    assert answer.json()["errors"][0] | {"message": ""} == {"message": "", "line": 2, "column": 3}
    ok = post(client, "/api/v1/templates/preview", {"source": REFERRAL_SOURCE})
    assert ok.status_code == 200 and [f["name"] for f in ok.json()["fields"]][:2] == [
        "doctor", "patient_name"]  # fmt: skip


def test_versions_are_saved_unpublished_compared_and_published(user: Any, version: Any) -> None:
    client = author_client(user)
    base = "/api/v1/templates/referral"
    saved = post(client, f"{base}/versions",
                 {"source": REFERRAL_SOURCE.replace("Kind regards", "Best wishes")})
    assert saved.status_code == 201 and saved.json()["version"] == 2
    assert saved.json()["published"] is False
    diff = client.get(f"{base}/versions/2").json()["diff"]
    assert "-Kind regards," in diff and "+Best wishes," in diff
    people = client.get("/api/v1/templates").json()["templates"]
    assert [t["version"] for t in people if t["slug"] == "referral"] == [1]
    assert post(client, f"{base}/publish", {"version": 2}).json()["published"] is True
    draft = post(client, "/api/v1/drafts", {"template": "referral", "values": VALUES}).json()
    assert draft["template_version"] == 2
    assert post(client, f"{base}/unpublish", {}).status_code == 200
    assert post(client, "/api/v1/drafts",
                {"template": "referral", "values": VALUES}).status_code == 404
    assert client.get("/api/v1/templates").json()["templates"] == []


def test_a_person_who_is_not_a_template_author_cannot_write_templates(token_client: Client,
                                                                      version: Any) -> None:
    base = "/api/v1/templates/referral"
    assert post(token_client, f"{base}/versions", {"source": REFERRAL_SOURCE}).status_code == 403
    assert post(token_client, f"{base}/publish", {"version": 1}).status_code == 403
    assert post(token_client, "/api/v1/templates/preview", {"source": "x"}).status_code == 403


def test_the_editor_page_refuses_a_broken_source_and_keeps_it(client: Client, user: Any,
                                                              db: Any) -> None:  # fmt: skip
    user.groups.add(template_authors_group())
    client.force_login(user)
    broken = 'Hi {{ field("a") }}\n{% if x %}y{% endif %}'
    response = client.post("/authoring/new/", {"slug": "hi", "title": "Hi", "kind": "letter",
                                               "doc_format": "text", "source": broken,
                                               "action": "save"})  # fmt: skip
    assert response.status_code == 400
    html = response.content.decode()
    assert "Line 2, column 1:" in html and "if is not allowed" in html
    assert "{% if x %}y{% endif %}" in html  # the typed source is still in the box
    assert client.get("/authoring/").status_code == 200


def test_a_template_slug_that_is_not_a_slug_is_refused(db: Any) -> None:
    import pytest

    from drafting.authoring import template_version_create
    from drafting.models import DocumentTemplate
    from drafting.templating import TemplateError

    for slug in ("../etc", "Referral", "a b", "", "x" * 81):
        with pytest.raises(TemplateError, match="lowercase letters, digits and hyphens"):
            template_version_create(slug=slug, title="T", kind="letter", source=REFERRAL_SOURCE)
    assert not DocumentTemplate.objects.exists()
