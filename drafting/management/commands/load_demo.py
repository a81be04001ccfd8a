"""Load the demo templates and the demo accounts. Safe to run again: nothing is duplicated."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from django.contrib.auth.models import Group, Permission, User
from django.core.management.base import BaseCommand

from drafting.services import template_version_create

DEMO_DIR = Path(__file__).resolve().parents[2] / "demo"
REVIEWERS = "reviewers"


AUTHORS = "template authors"


def template_authors_group() -> Group:
    group, _ = Group.objects.get_or_create(name=AUTHORS)
    group.permissions.add(Permission.objects.get(codename="author_template"))
    return group


def reviewers_group() -> Group:
    group, _ = Group.objects.get_or_create(name=REVIEWERS)
    group.permissions.add(Permission.objects.get(codename="accept_draft"))
    return group


class Command(BaseCommand):
    help = "Load the demo templates, a demo user (a reviewer) and an admin."

    def handle(self, *args: Any, **options: Any) -> None:
        for entry in json.loads((DEMO_DIR / "index.json").read_text()):
            version = template_version_create(
                slug=entry["slug"], title=entry["title"], kind=entry["kind"],
                description=entry.get("description", ""),
                source=(DEMO_DIR / f"{entry['slug']}.j2").read_text(),
                route_hint=entry.get("route_hint", "auto"),
                doc_format=entry.get("doc_format", "text"),
            )  # fmt: skip
            self.stdout.write(f"template {entry['slug']} v{version.number}")
        group = reviewers_group()
        password = os.getenv("STENCIL_DEMO_PASSWORD", "stencil-demo")
        demo, created = User.objects.get_or_create(username="demo", defaults={"email": ""})
        if created:
            demo.set_password(password)
            demo.save()
        demo.groups.add(group)
        author, created = User.objects.get_or_create(username="author", defaults={"email": ""})
        if created:
            author.set_password(password)
            author.save()
        author.groups.add(template_authors_group(), group)
        admin, created = User.objects.get_or_create(
            username="admin", defaults={"is_staff": True, "is_superuser": True}
        )
        if created:
            admin.set_password(os.getenv("STENCIL_ADMIN_PASSWORD", "stencil-admin"))
            admin.save()
        self.stdout.write("accounts: demo (reviewer), author (template author and reviewer), "
                          "admin (superuser)")
