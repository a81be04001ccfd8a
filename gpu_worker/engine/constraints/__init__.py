"""Hole constraints, enforced while decoding rather than checked afterwards.

* ``choices``: the hole is one of a list of strings, scored as whole candidates under the model
  (the sampler commits one candidate's tokens at once, never a mix of two).
* ``pattern``: a regular expression (a supported subset, anchored full match) compiled by hand
  to an automaton over characters, lifted to tokens: at each position of the hole, decoded left
  to right, only tokens that keep the text completable within the positions left are allowed.
* ``schema``: a JSON Schema turned into a skeleton whose keys and punctuation are locked text
  and whose values are typed holes (string / integer / number via patterns, boolean / enum via
  choices).

The regex subset: literals, ``.``, classes ``[a-z0-9]`` and ``[^...]``, ``\\d \\w \\s`` (and
``\\D \\W \\S``, ASCII meanings as ``re.ASCII``), ``\\xhh``, ``? * + {m} {m,} {m,n}``, ``|``,
groups ``(...)`` / ``(?:...)``, ``^`` at the start and ``$`` at the end. Anything else
(backreferences, lookaround, word boundaries, lazy or possessive quantifiers, inline flags)
raises ``ValueError`` naming the feature.

Modules: ``regex`` (the subset and its automaton), ``tokens`` (lifting it to a vocabulary;
choices), ``schema`` (JSON Schema skeletons).
"""

from __future__ import annotations

from gpu_worker.engine.constraints.regex import (
    CharAutomaton,
    check_pattern,
    parse_pattern,
    pattern_fullmatch,
)
from gpu_worker.engine.constraints.schema import (
    JSON_STRING_BODY,
    SkeletonText,
    SkeletonValue,
    integer_range_pattern,
    integer_schema_pattern,
    schema_skeleton,
)
from gpu_worker.engine.constraints.tokens import (
    ChoiceConstraint,
    PatternConstraint,
    TokenTable,
    build_choices,
    pattern_constraint,
    token_table,
)

__all__ = [
    "CharAutomaton",
    "ChoiceConstraint",
    "JSON_STRING_BODY",
    "PatternConstraint",
    "SkeletonText",
    "SkeletonValue",
    "TokenTable",
    "build_choices",
    "check_pattern",
    "integer_range_pattern",
    "integer_schema_pattern",
    "parse_pattern",
    "pattern_constraint",
    "pattern_fullmatch",
    "schema_skeleton",
    "token_table",
]
