"""``manage.py corpus_import PATH [PATH ...] --name NAME`` (or ``--corpus ID``): import files,
zips and directories of documents into a corpus, as the upload page does, and print each
file's outcome."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from corpora import services
from corpora.models import Corpus
from drafting.services import UserError


def read_paths(paths: list[Path]) -> list[tuple[str, bytes]]:
    """(name, bytes) of each file; a directory gives its files, walked in name order, named by
    their path under it."""
    files: list[tuple[str, bytes]] = []
    for path in paths:
        if path.is_dir():
            for child in sorted(p for p in path.rglob("*") if p.is_file()):
                if not any(part.startswith(".") for part in child.relative_to(path).parts):
                    files.append((child.relative_to(path).as_posix(), child.read_bytes()))
        elif path.is_file():
            files.append((path.name, path.read_bytes()))
        else:
            raise CommandError(f"{path}: no such file or directory")
    return files


class Command(BaseCommand):
    help = "Import documents (.txt, .md, .docx, zips of them, directories) into a corpus."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("paths", nargs="+", type=Path)
        target = parser.add_mutually_exclusive_group(required=True)
        target.add_argument("--name", help="a new corpus of this name")
        target.add_argument("--corpus", type=int, help="the id of an existing corpus")
        parser.add_argument("--user", help="the staff user who owns the import (default: none)")
        parser.add_argument("--quiet-added", action="store_true",
                            help="print only the skipped files and the totals")

    def handle(self, *args: Any, **options: Any) -> None:
        user = None
        if options["user"]:
            user = get_user_model().objects.filter(username=options["user"]).first()
            if user is None or not user.is_staff:
                raise CommandError(f"{options['user']} is not a staff user")
        files = read_paths(options["paths"])
        if options["corpus"] is not None:
            corpus = Corpus.objects.filter(pk=options["corpus"]).first()
            if corpus is None:
                raise CommandError(f"no corpus {options['corpus']}")
        else:
            try:
                corpus = services.corpus_create(owner=user, name=options["name"])
            except UserError as exc:
                raise CommandError(str(exc)) from exc
        try:
            outcome = services.corpus_import(corpus=corpus, user=user, files=files)
        except UserError as exc:
            raise CommandError(str(exc)) from exc
        for entry in outcome.batch.report:
            if entry["outcome"] == "added" and options["quiet_added"]:
                continue
            detail = f"{entry['tokens']} tokens" if entry["outcome"] == "added" else entry["reason"]
            self.stdout.write(f"{entry['outcome']:8s} {entry['name']}: {detail}")
        corpus.refresh_from_db()
        self.stdout.write(f"corpus {corpus.id} ({corpus.name}): {len(outcome.added)} added, "
                          f"{len(outcome.skipped)} skipped; {corpus.documents} documents, "
                          f"{corpus.tokens} tokens")  # fmt: skip
