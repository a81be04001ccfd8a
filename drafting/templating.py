"""Stencil's template language, on Jinja2's sandbox.

A template is locked text with two kinds of slots:

* ``{{ field("patient_name", type="text", label="Patient", max_length=60) }}`` — filled by the
  person through a web form. Repeating ``{{ field("patient_name") }}`` reuses the value.
* ``{% infill "summary", max_tokens=64, pattern="...", choices=[...], schema={...} %}hint
  {% endinfill %}`` — filled by the model. The body is a hint shown to the person.

Everything else is locked text. Only these constructs are allowed; loops, conditions,
filters, attribute access and unknown keywords are rejected when the template is saved.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any

import jsonschema
from jinja2 import TemplateSyntaxError, nodes
from jinja2.ext import Extension
from jinja2.parser import Parser
from jinja2.sandbox import SandboxedEnvironment

from drafting.docformat import (
    DATE_FORMATS,
    DOC_FORMATS,
    NUMBER_FORMATS,
    document_schema,
    json_skeleton,
    json_skeleton_error,
    slot_contexts,
)
from drafting.fieldcheck import field_errors, fields_json_schema  # noqa: F401 (re-exported)

FIELD_TYPES = {"text", "textarea", "date", "integer", "number", "email", "choice"}
FIELD_KEYWORDS = {
    "type", "label", "help", "required", "max_length", "min_length", "pattern", "choices",
    "minimum", "maximum", "default", "format",
}  # fmt: skip
HOLE_KEYWORDS = {"max_tokens", "pattern", "choices", "schema", "label"}
MAX_HOLE_TOKENS = 256
MAX_FIELDS = 60
MAX_HOLES = 40
NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,59}$")
_MARK_OPEN, _MARK_CLOSE = "\ue000", "\ue001"  # private-use characters delimit slots in output
_MARK_RE = re.compile(f"{_MARK_OPEN}([fh]):(\\d+){_MARK_CLOSE}")


class TemplateError(ValueError):
    """A template that cannot be saved; the message says where and why.

    ``line`` and ``column`` are 1-based positions in the source (0 when unknown).
    """

    def __init__(self, message: str, *, line: int = 0, column: int = 0) -> None:
        super().__init__(message)
        self.line, self.column = line, column


@dataclass(frozen=True)
class FieldSpec:
    name: str
    type: str = "text"
    label: str = ""
    help: str = ""
    required: bool = True
    max_length: int | None = None
    min_length: int | None = None
    pattern: str | None = None
    choices: list[str] | None = None
    minimum: float | None = None
    maximum: float | None = None
    default: str | None = None
    format: str | None = None  # display format: a date's or a number's (docformat)

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass(frozen=True)
class HoleSpec:
    name: str
    max_tokens: int
    hint: str = ""
    label: str = ""
    constraint: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Piece:
    """One rendered piece: locked text, a field reference or a hole, in document order."""

    kind: str  # "text" | "field" | "fill"
    name: str = ""
    text: str = ""


@dataclass(frozen=True)
class ParsedTemplate:
    fields: list[FieldSpec]
    holes: list[HoleSpec]
    pieces: list[Piece]
    doc_format: str = "text"
    contexts: list[str] = field(default_factory=list)  # per piece (docformat.slot_contexts)

    def spec_of(self, piece: Piece) -> dict[str, Any]:
        """The declaration of a field or fill piece as JSON ({} for text)."""
        if piece.kind == "field":
            return next(f.to_json() for f in self.fields if f.name == piece.name)
        if piece.kind == "fill":
            return next(h.to_json() for h in self.holes if h.name == piece.name)
        return {}

    def document_schema(self) -> dict[str, Any] | None:
        """The JSON Schema of a JSON template's documents (None for other formats)."""
        if self.doc_format != "json":
            return None
        pairs = [(p.kind, p.text) for p in self.pieces]
        return document_schema(pairs, self.contexts, [self.spec_of(p) for p in self.pieces])


class InfillExtension(Extension):
    """``{% infill "name", key=value, ... %}hint{% endinfill %}``."""

    tags = {"infill"}

    def parse(self, parser: Parser) -> nodes.Node:
        lineno = next(parser.stream).lineno
        args: list[nodes.Expr] = [parser.parse_expression()]
        kwargs: list[nodes.Keyword] = []
        while parser.stream.skip_if("comma"):
            key = parser.stream.expect("name")
            parser.stream.expect("assign")
            kwargs.append(nodes.Keyword(key.value, parser.parse_expression(), lineno=key.lineno))
        body = parser.parse_statements(("name:endinfill",), drop_needle=True)
        call = self.call_method("_hole", [args[0], nodes.Dict([
            nodes.Pair(nodes.Const(k.key), k.value) for k in kwargs
        ])])  # fmt: skip
        return nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    def _hole(self, name: Any, options: dict[str, Any], caller: Any) -> str:
        recorder: _Recorder = self.environment.globals["_recorder"]  # type: ignore[assignment]
        return recorder.hole(name, options, str(caller()))


class _Recorder:
    """Collects declarations while the sandbox renders, and emits slot markers."""

    def __init__(self) -> None:
        self.fields: dict[str, FieldSpec] = {}
        self.field_order: list[str] = []
        self.holes: list[HoleSpec] = []

    def field(self, name: Any, **options: Any) -> str:
        spec = _field_spec(name, options)
        known = self.fields.get(spec.name)
        if known is None:
            if len(self.fields) >= MAX_FIELDS:
                raise TemplateError(f"a template may declare at most {MAX_FIELDS} fields")
            self.fields[spec.name] = spec
            self.field_order.append(spec.name)
        elif options and spec != known:
            raise TemplateError(
                f"field {spec.name!r} is declared twice with different options; "
                "repeat it as {{ field(\"" + spec.name + "\") }}"
            )
        return f"{_MARK_OPEN}f:{self.field_order.index(spec.name)}{_MARK_CLOSE}"

    def hole(self, name: Any, options: dict[str, Any], hint: str) -> str:
        spec = _hole_spec(name, options, hint.strip())
        if any(h.name == spec.name for h in self.holes):
            raise TemplateError(f"infill {spec.name!r} is declared twice")
        if spec.name in self.fields:
            raise TemplateError(f"{spec.name!r} is both a field and an infill")
        if len(self.holes) >= MAX_HOLES:
            raise TemplateError(f"a template may declare at most {MAX_HOLES} infills")
        self.holes.append(spec)
        return f"{_MARK_OPEN}h:{len(self.holes) - 1}{_MARK_CLOSE}"


def _check_name(name: Any, what: str) -> str:
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise TemplateError(
            f"{what} name {name!r} must be lowercase letters, digits and _ (starting with a letter)"
        )
    return name


def _field_spec(name: Any, options: dict[str, Any]) -> FieldSpec:
    name = _check_name(name, "field")
    unknown = sorted(set(options) - FIELD_KEYWORDS)
    if unknown:
        raise TemplateError(
            f"field {name!r}: unsupported keyword(s) {', '.join(unknown)}; "
            f"allowed: {', '.join(sorted(FIELD_KEYWORDS))}"
        )
    ftype = options.get("type", "text")
    if ftype not in FIELD_TYPES:
        raise TemplateError(
            f"field {name!r}: type {ftype!r} is not one of {', '.join(sorted(FIELD_TYPES))}"
        )
    choices = options.get("choices")
    if ftype == "choice" and not choices:
        raise TemplateError(f"field {name!r}: type 'choice' needs choices=[...]")
    if choices is not None and (
        not isinstance(choices, list) or not all(isinstance(c, str) and c for c in choices)
    ):
        raise TemplateError(f"field {name!r}: choices must be a list of non-empty strings")
    for key in ("max_length", "min_length"):
        value = options.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < 0):  # fmt: skip
            raise TemplateError(f"field {name!r}: {key} must be a non-negative integer")
    for key in ("minimum", "maximum"):
        value = options.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)
                                  or value != value):  # fmt: skip
            raise TemplateError(f"field {name!r}: {key} must be a number, got {value!r}")
    if "required" in options and not isinstance(options["required"], bool):
        raise TemplateError(f"field {name!r}: required must be True or False")
    pattern = options.get("pattern")
    if pattern is not None:
        try:
            re.compile(pattern)
        except (re.error, TypeError) as exc:
            raise TemplateError(f"field {name!r}: pattern is not a valid regex: {exc}") from exc
        _sampler_pattern_check(pattern, f"field {name!r}")  # values are matched by its automaton
    display = options.get("format")
    allowed = {"date": DATE_FORMATS, "integer": NUMBER_FORMATS, "number": NUMBER_FORMATS}
    if display is not None and display not in allowed.get(ftype, ()):
        kinds = "; ".join(f"{t}: {', '.join(f)}" for t, f in allowed.items())
        raise TemplateError(f"field {name!r}: format {display!r} does not fit type {ftype!r} "
                            f"(formats: {kinds})")  # fmt: skip
    return FieldSpec(
        name=name,
        type=ftype,
        label=str(options.get("label") or name.replace("_", " ").capitalize()),
        help=str(options.get("help", "")),
        required=bool(options.get("required", True)),
        max_length=options.get("max_length"),
        min_length=options.get("min_length"),
        pattern=pattern,
        choices=choices,
        minimum=options.get("minimum"),
        maximum=options.get("maximum"),
        default=options.get("default"),
        format=display,
    )


def _hole_spec(name: Any, options: dict[str, Any], hint: str) -> HoleSpec:
    name = _check_name(name, "infill")
    unknown = sorted(set(options) - HOLE_KEYWORDS)
    if unknown:
        raise TemplateError(
            f"infill {name!r}: unsupported keyword(s) {', '.join(unknown)}; "
            f"allowed: {', '.join(sorted(HOLE_KEYWORDS))}"
        )
    max_tokens = options.get("max_tokens")
    if not isinstance(max_tokens, int) or not 1 <= max_tokens <= MAX_HOLE_TOKENS:
        raise TemplateError(
            f"infill {name!r}: max_tokens must be an integer from 1 to {MAX_HOLE_TOKENS}"
        )
    constraint: dict[str, Any] = {
        k: options[k] for k in ("pattern", "choices", "schema") if k in options
    }
    constraint_check(constraint, where=f"infill {name!r}")
    return HoleSpec(
        name=name,
        max_tokens=max_tokens,
        hint=hint,
        label=str(options.get("label") or name.replace("_", " ").capitalize()),
        constraint=constraint,
    )


def constraint_check(constraint: dict[str, Any], *, where: str) -> None:
    """Raise TemplateError unless the hole constraint is one the sampler enforces."""
    if len(constraint) > 1:
        raise TemplateError(f"{where}: use one of pattern, choices or schema, not several")
    if "choices" in constraint:
        choices = constraint["choices"]
        if not isinstance(choices, list) or not choices or not all(
            isinstance(c, str) and c for c in choices
        ):
            raise TemplateError(f"{where}: choices must be a non-empty list of non-empty strings")
    if "pattern" in constraint:
        pattern = constraint["pattern"]
        if not isinstance(pattern, str) or not pattern:
            raise TemplateError(f"{where}: pattern must be a non-empty string")
        try:
            re.compile(pattern)
        except re.error as exc:
            raise TemplateError(f"{where}: pattern is not a valid regex: {exc}") from exc
        _sampler_pattern_check(pattern, where)
    if "schema" in constraint:
        schema = constraint["schema"]
        if not isinstance(schema, dict):
            raise TemplateError(f"{where}: schema must be a JSON object")
        try:
            jsonschema.Draft202012Validator.check_schema(schema)
        except jsonschema.SchemaError as exc:
            raise TemplateError(f"{where}: schema is not a valid JSON Schema: {exc.message}") from exc
        _sampler_schema_check(schema, where)


def _sampler_pattern_check(pattern: str, where: str) -> None:
    """Reject regex features the sampler cannot enforce while decoding."""
    from gpu_worker.engine.constraints import check_pattern

    try:
        check_pattern(pattern)
    except ValueError as exc:
        raise TemplateError(f"{where}: {exc}") from exc


def _sampler_schema_check(schema: dict[str, Any], where: str) -> None:
    """Reject JSON Schema keywords the sampler cannot enforce while decoding."""
    from gpu_worker.engine.constraints import schema_skeleton

    try:
        schema_skeleton(schema, hole="schema")
    except ValueError as exc:
        raise TemplateError(f"{where}: {exc}") from exc


# -- the whitelist of constructs ----------------------------------------------------------
_ALLOWED_NODES = (
    nodes.Template, nodes.Output, nodes.TemplateData, nodes.Const, nodes.List, nodes.Dict,
    nodes.Pair, nodes.Keyword, nodes.CallBlock, nodes.ExtensionAttribute, nodes.Neg,
)  # fmt: skip


def _check_constructs(tree: nodes.Node) -> None:
    for node in tree.find_all(nodes.Node):
        if isinstance(node, _ALLOWED_NODES):
            continue
        if isinstance(node, nodes.Call):
            if not (isinstance(node.node, nodes.Name | nodes.ExtensionAttribute)):
                raise TemplateError(f"line {node.lineno}: only field(...) may be called")
            if isinstance(node.node, nodes.Name) and node.node.name != "field":
                raise TemplateError(
                    f"line {node.lineno}: {node.node.name}(...) is not allowed; "
                    "only field(...) and {% infill %} blocks"
                )
            if node.dyn_args is not None or node.dyn_kwargs is not None:
                raise TemplateError(f"line {node.lineno}: *args and **kwargs are not allowed")
            continue
        if isinstance(node, nodes.Name) and node.name == "field":
            continue
        what = type(node).__name__.lower()
        raise TemplateError(
            f"line {getattr(node, 'lineno', '?')}: {what} is not allowed in a Stencil template; "
            "only text, {{ field(...) }} and {% infill %}...{% endinfill %}"
        )
    for call in tree.find_all(nodes.Call):
        for arg in [*call.args, *(kw.value for kw in call.kwargs)]:
            if not _is_literal(arg):
                raise TemplateError(f"line {call.lineno}: arguments must be literal values")


def _is_literal(node: nodes.Node) -> bool:
    if isinstance(node, nodes.Const):
        return True
    if isinstance(node, nodes.Neg):
        return _is_literal(node.node)
    if isinstance(node, nodes.List):
        return all(_is_literal(item) for item in node.items)
    if isinstance(node, nodes.Dict):
        return all(_is_literal(p.key) and _is_literal(p.value) for p in node.items)
    return False


def _environment(recorder: _Recorder) -> SandboxedEnvironment:
    env = SandboxedEnvironment(
        extensions=[InfillExtension],
        autoescape=False,
        keep_trailing_newline=True,
        undefined=__import__("jinja2").StrictUndefined,
    )
    env.globals["field"] = recorder.field
    env.globals["_recorder"] = recorder
    return env


def parse_template(source: str, *, max_bytes: int = 65536, doc_format: str = "text"
                   ) -> ParsedTemplate:  # fmt: skip
    """Validate a template's source and return its declarations and pieces.

    Raises TemplateError with a message a person can act on.
    """
    if doc_format not in DOC_FORMATS:
        raise TemplateError(f"the document format must be one of {', '.join(DOC_FORMATS)}")
    if not isinstance(source, str) or not source.strip():
        raise TemplateError("the template is empty")
    if len(source.encode()) > max_bytes:
        raise TemplateError(f"the template is larger than {max_bytes} bytes")
    if _MARK_OPEN in source or _MARK_CLOSE in source:
        raise TemplateError("the template contains reserved characters U+E000 / U+E001")
    recorder = _Recorder()
    env = _environment(recorder)
    try:
        tree = env.parse(source)
        _check_constructs(tree)
        rendered = env.from_string(source).render()
    except TemplateSyntaxError as exc:
        line = exc.lineno or 0
        raise TemplateError(f"line {line}: {exc.message}", line=line,
                            column=_tag_column(source, line)) from exc
    except TemplateError as exc:
        raise _located(exc, source) from exc
    except Exception as exc:  # sandbox violations and type errors in arguments
        raise TemplateError(f"the template could not be read: {exc}") from exc
    fields = [recorder.fields[name] for name in recorder.field_order]
    pieces = _split(rendered, fields, recorder.holes)
    if not recorder.holes and not fields:
        raise TemplateError("the template declares no field() and no {% infill %}")
    pairs = [(p.kind, p.text) for p in pieces]
    contexts = slot_contexts(pairs, doc_format)
    if doc_format == "json":
        skeleton = json_skeleton(pairs, contexts)
        problem = json_skeleton_error(skeleton)
        if problem is not None:
            line, column = _skeleton_position(source, pieces, skeleton, problem)
            raise TemplateError(f"line {line}, column {column}: {problem.message}" if line
                                else problem.message, line=line, column=column)  # fmt: skip
    return ParsedTemplate(fields=fields, holes=recorder.holes, pieces=pieces,
                          doc_format=doc_format, contexts=contexts)  # fmt: skip


_LINE_PREFIX = re.compile(r"^line (\d+)")
_NAMED = re.compile(r"^(field|infill)(?: name)? '([^']+)'")


def _position(source: str, offset: int) -> tuple[int, int]:
    """1-based (line, column) of a character offset in ``source``."""
    before = source[:offset]
    return before.count("\n") + 1, offset - (before.rfind("\n") + 1) + 1


def _tag_column(source: str, line: int) -> int:
    """The column of the first tag on ``line`` (1 when it has none or the line is unknown)."""
    lines = source.split("\n")
    if not 1 <= line <= len(lines):
        return 0 if line == 0 else 1
    found = [i for i in (lines[line - 1].find("{%"), lines[line - 1].find("{{")) if i >= 0]
    return min(found) + 1 if found else 1


def _located(exc: TemplateError, source: str) -> TemplateError:
    """The same error with a line and column: from "line N" in its message, or where the
    field or infill it names is declared."""
    if exc.line:
        return exc
    message = str(exc)
    prefix = _LINE_PREFIX.match(message)
    if prefix:
        line = int(prefix.group(1))
        return TemplateError(message, line=line, column=_tag_column(source, line))
    named = _NAMED.match(message)
    if named:
        kind, name = named.groups()
        pattern = (rf"field\(\s*[\"']{re.escape(name)}[\"']" if kind == "field"
                   else rf"infill\s+[\"']{re.escape(name)}[\"']")  # fmt: skip
        match = re.search(pattern, source)
        if match:
            tag = max(source.rfind("{{", 0, match.start()), source.rfind("{%", 0, match.start()))
            line, column = _position(source, tag if tag >= 0 else match.start())
            return TemplateError(f"line {line}: {message}", line=line, column=column)
    return exc


def _skeleton_position(source: str, pieces: list[Piece], skeleton: str,
                       problem: Any) -> tuple[int, int]:  # fmt: skip
    """Where in ``source`` a JSON error found in the skeleton is: the text pieces stand in the
    source verbatim and in order, so the error's offset inside its piece maps back."""
    lines = skeleton.split("\n")
    if not 1 <= problem.line <= len(lines):
        return 0, 0
    offset = sum(len(x) + 1 for x in lines[: problem.line - 1]) + problem.column - 1
    cursor_skeleton = cursor_source = 0
    slot = 0
    for piece in pieces:
        if piece.kind == "text":
            at = source.find(piece.text, cursor_source)
            if at < 0:
                return 0, 0
            if cursor_skeleton <= offset < cursor_skeleton + len(piece.text) or not piece.text:
                return _position(source, at + offset - cursor_skeleton)
            cursor_skeleton += len(piece.text)
            cursor_source = at + len(piece.text)
        else:
            width = len(skeleton) if slot < 0 else _slot_width(skeleton, cursor_skeleton)
            if cursor_skeleton <= offset < cursor_skeleton + width:
                return _position(source, cursor_source)
            cursor_skeleton += width
            slot += 1
    return _position(source, min(cursor_source, len(source)))


def _slot_width(skeleton: str, start: int) -> int:
    """Length of the slot stand-in that starts at ``start`` of the skeleton."""
    end = skeleton.find("\ue003", start)
    if end < 0:
        return 0
    return end - start + 1 + (1 if skeleton[start] == '"' else 0)


def _split(rendered: str, fields: list[FieldSpec], holes: list[HoleSpec]) -> list[Piece]:
    pieces: list[Piece] = []
    cursor = 0
    for match in _MARK_RE.finditer(rendered):
        if match.start() > cursor:
            pieces.append(Piece("text", text=rendered[cursor : match.start()]))
        index = int(match.group(2))
        if match.group(1) == "f":
            pieces.append(Piece("field", name=fields[index].name))
        else:
            pieces.append(Piece("fill", name=holes[index].name))
        cursor = match.end()
    if cursor < len(rendered):
        pieces.append(Piece("text", text=rendered[cursor:]))
    return pieces


def dumps(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))
