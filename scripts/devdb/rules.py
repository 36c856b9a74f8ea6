"""What mongod refuses that the dev server accepts, and the shape of every command.

Pure functions, no I/O: `serve.py` runs them inside the dev server's process before
each command reaches SecantusDB. Two jobs:

* `refusal(cmd, doc)` answers a command as mongod 6.0 to 8.x would when it breaks one
  of mongod's rules that the dev server does not enforce; None when mongod takes it.
  Each rule names the place in mongod's source or manual it follows
  (docs/mongodb.md lists them with links).
* `shapes(cmd, doc)` names what a command asks of the server, without its data: the
  command, its collection, and the operators, stages and system variables in its
  filter, update and pipeline (a multi-statement write gives one shape a statement).
  docs/mongodb.md's audited table lists every shape slotpool and its suite send.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: The oldest MongoDB slotpool supports (docs/mongodb.md). An operator, stage or
#: variable that came later is refused as this version refuses a word it does not know.
MINIMUM = (6, 0)

# === what came after the minimum ===
#
# Each entry: name -> (the release it came in, its kind), from the MongoDB manual's
# "New in version" line on the operator's page (docs/mongodb.md links the pages).
# The kind says how mongod of the minimum version answers the unknown word.
LATER: dict[str, tuple[tuple[int, int], str]] = {
    # Aggregation expressions.
    "$bitAnd": ((6, 3), "expression"),
    "$bitOr": ((6, 3), "expression"),
    "$bitXor": ((6, 3), "expression"),
    "$bitNot": ((6, 3), "expression"),
    "$median": ((7, 0), "accumulator"),
    "$percentile": ((7, 0), "accumulator"),
    "$toUUID": ((8, 0), "expression"),
    "$sigmoid": ((8, 2), "expression"),
    "$createObjectId": ((8, 2), "expression"),
    # Stages.
    "$changeStreamSplitLargeEvent": ((7, 0), "stage"),
    "$listSampledQueries": ((7, 0), "stage"),
    "$queryStats": ((7, 1), "stage"),
    "$vectorSearch": ((7, 0), "stage"),
    "$listClusterCatalog": ((8, 0), "stage"),
    "$rankFusion": ((8, 1), "stage"),
    "$scoreFusion": ((8, 2), "stage"),
    "$score": ((8, 2), "stage"),
    # System variables.
    "$$USER_ROLES": ((7, 0), "variable"),
}

#: The stages an update pipeline may hold: mongod's `isAllowedWithinUpdatePipeline`
#: (src/mongo/db/update/pipeline_executor.cpp refuses every other).
UPDATE_STAGES = frozenset(
    {"$addFields", "$set", "$project", "$unset", "$replaceRoot", "$replaceWith"}
)

#: Query operators whose argument is itself a query (walked), beside `$expr`.
QUERY_LISTS = frozenset({"$and", "$or", "$nor"})
#: Top-level query operators whose argument is not walked.
QUERY_LEAVES = frozenset(
    {"$jsonSchema", "$where", "$text", "$comment", "$alwaysTrue", "$alwaysFalse", "$sampleRate"}
)
#: System variables worth naming in a shape ($$this and a `let`'s names are not).
SYSTEM_VARIABLES = frozenset(
    {"NOW", "CLUSTER_TIME", "ROOT", "CURRENT", "REMOVE", "DESCEND", "PRUNE", "KEEP",
     "SEARCH_META", "USER_ROLES"}
)


# === shapes ===


class _Found:
    """The operators (and, apart, the stages) one part of a command names."""

    def __init__(self) -> None:
        self.ops: set[str] = set()
        self.stages: list[str] = []

    def text(self, pipeline: bool) -> str:
        ops = ",".join(sorted(self.ops))
        if pipeline:
            return "[" + ",".join(sorted(set(self.stages))) + "]" + ops
        return ops


def _expr(value: Any, found: _Found) -> None:
    """An aggregation expression: every `$`-key is an operator, `$$NAME` a variable;
    `$literal`'s argument is data."""
    if isinstance(value, Mapping):
        for key, arg in value.items():
            if isinstance(key, str) and key.startswith("$"):
                found.ops.add(key)
                if key == "$literal":
                    continue
            _expr(arg, found)
    elif isinstance(value, list):
        for item in value:
            _expr(item, found)
    elif isinstance(value, str) and value.startswith("$$"):
        name = value[2:].split(".", 1)[0]
        if name in SYSTEM_VARIABLES:
            found.ops.add("$$" + name)


def _operator_doc(value: Any) -> bool:
    return (
        isinstance(value, Mapping)
        and len(value) > 0
        and isinstance(next(iter(value)), str)
        and next(iter(value)).startswith("$")
    )


def _query(value: Any, found: _Found) -> None:
    """A query filter: field names map to values or operator documents."""
    if not isinstance(value, Mapping):
        return
    for key, arg in value.items():
        if isinstance(key, str) and key.startswith("$"):
            found.ops.add(key)
            if key in QUERY_LISTS and isinstance(arg, list):
                for sub in arg:
                    _query(sub, found)
            elif key == "$expr":
                _expr(arg, found)
            continue
        if _operator_doc(arg):
            _field_ops(arg, found)


def _field_ops(ops: Mapping, found: _Found) -> None:
    for op, arg in ops.items():
        found.ops.add(op)
        if op == "$elemMatch":
            _query(arg, found)
        elif op == "$not" and _operator_doc(arg):
            _field_ops(arg, found)


def _pipeline(stages: Any, found: _Found) -> None:
    if not isinstance(stages, list):
        return
    for stage in stages:
        if not isinstance(stage, Mapping) or not stage:
            continue
        name, arg = next(iter(stage.items()))
        found.stages.append(name)
        if name == "$match":
            _query(arg, found)
        elif name == "$facet" and isinstance(arg, Mapping):
            for sub in arg.values():
                _pipeline(sub, found)
        elif name in ("$lookup", "$unionWith", "$graphLookup") and isinstance(arg, Mapping):
            _pipeline(arg.get("pipeline"), found)
            _expr(arg.get("let"), found)
        elif name in ("$sort", "$limit", "$skip", "$count", "$out", "$merge", "$sample",
                      "$unwind", "$unset", "$collStats", "$indexStats", "$currentOp",
                      "$changeStream", "$documents"):
            if name == "$sort" and isinstance(arg, Mapping):
                _expr([v for v in arg.values() if isinstance(v, Mapping)], found)
        else:
            _expr(arg, found)


def _update(u: Any) -> str:
    """An update: a pipeline, modifiers (their names, and `$push`'s own), or a
    replacement document."""
    found = _Found()
    if isinstance(u, list):
        _pipeline(u, found)
        return found.text(pipeline=True)
    if _operator_doc(u):
        for op, fields in u.items():
            found.ops.add(op)
            if op in ("$push", "$addToSet") and isinstance(fields, Mapping):
                for each in fields.values():
                    if _operator_doc(each):
                        found.ops.update(k for k in each if k.startswith("$"))
        return found.text(pipeline=False)
    return "replacement"


def _q(filter_: Any) -> str:
    found = _Found()
    _query(filter_, found)
    return found.text(pipeline=False)


def _p(stages: Any) -> str:
    found = _Found()
    _pipeline(stages, found)
    return found.text(pipeline=True)


def _parts(*parts: tuple[str, str | None]) -> str:
    """` q=... u=... upsert`: each part that names something, after a space."""
    return "".join(f" {k}={v}" if v is not None else f" {k}" for k, v in parts if k and v != "")


#: The commands whose first value names a collection (the others name a user, a
#: parameter, ...: data, left out of the shape).
ON_COLLECTION = frozenset(
    {"find", "aggregate", "update", "delete", "insert", "findAndModify", "count",
     "distinct", "create", "collMod", "createIndexes", "drop", "dropIndexes",
     "listIndexes", "collStats", "validate"}
)


def _collection(cmd: str, doc: Mapping) -> str:
    target = doc.get(cmd)
    return target if cmd in ON_COLLECTION and isinstance(target, str) else ""


def shapes(cmd: str, doc: Mapping) -> list[str]:
    """The shape of each statement of the command (see the module's doc)."""
    coll = _collection(cmd, doc)
    head = f"{cmd} {coll}".strip()
    if cmd == "update":
        out = []
        for st in doc.get("updates") or []:
            if not isinstance(st, Mapping):
                continue
            flags = [("upsert", None)] if st.get("upsert") else []
            if st.get("multi"):
                flags.append(("multi", None))
            if st.get("arrayFilters") is not None:
                flags.append(("arrayFilters", None))
            out.append(
                head + _parts(("q", _q(st.get("q"))), ("u", _update(st.get("u"))), *flags)
            )
        return sorted(set(out)) or [head]
    if cmd == "delete":
        out = []
        for st in doc.get("deletes") or []:
            if isinstance(st, Mapping):
                many = [("many", None)] if st.get("limit") == 0 else []
                out.append(head + _parts(("q", _q(st.get("q"))), *many))
        return sorted(set(out)) or [head]
    if cmd == "findAndModify":
        flags = []
        for flag in ("upsert", "remove", "new"):
            if doc.get(flag):
                flags.append((flag, None))
        update = ("u", _update(doc["update"])) if "update" in doc else ("", "")
        return [head + _parts(("q", _q(doc.get("query"))), update, *flags)]
    if cmd in ("find", "count", "distinct"):
        key = "filter" if cmd == "find" else "query"
        found = _Found()
        _query(doc.get(key), found)
        proj = doc.get("projection")
        if isinstance(proj, Mapping):
            pf = _Found()
            _expr(proj, pf)
            if pf.ops:
                return [head + _parts(("q", found.text(False)), ("projection", pf.text(False)))]
        return [head + _parts(("q", found.text(False)))]
    if cmd == "aggregate":
        return [head + _parts(("p", _p(doc.get("pipeline"))))]
    if cmd == "explain":
        inner = doc.get("explain")
        if isinstance(inner, Mapping) and inner:
            return ["explain " + s for s in shapes(next(iter(inner)), inner)]
        return ["explain"]
    if cmd == "createIndexes":
        out = []
        for index in doc.get("indexes") or []:
            if not isinstance(index, Mapping):
                continue
            keys = index.get("key") or {}
            kinds = ",".join(
                sorted({("asc" if v == 1 else "desc" if v == -1 else str(v)) for v in keys.values()})
            )
            flags = [("keys", kinds)]
            for opt in ("unique", "sparse", "expireAfterSeconds", "collation", "hidden"):
                if opt in index:
                    flags.append((opt, None))
            if "partialFilterExpression" in index:
                flags.append(("partial", _q(index["partialFilterExpression"])))
            out.append(head + _parts(*flags))
        return sorted(set(out)) or [head]
    if cmd in ("create", "collMod"):
        flags = []
        if "validator" in doc:
            flags.append(("validator", _q(doc["validator"])))
        for opt in ("capped", "validationLevel", "validationAction", "timeseries",
                    "expireAfterSeconds", "changeStreamPreAndPostImages", "index"):
            if opt in doc:
                flags.append((opt, None))
        return [head + _parts(*flags)]
    return [head]


# === refusals ===


def _reply(code: int, name: str, message: str) -> dict[str, Any]:
    return {"ok": 0.0, "errmsg": message, "code": code, "codeName": name}


def _later(found: _Found, context: str) -> dict[str, Any] | None:
    """mongod 6.0's answer to the first word in `found` it does not know yet."""
    for word in sorted(found.ops) + sorted(set(found.stages)):
        entry = LATER.get(word)
        if entry is None or entry[0] <= MINIMUM:
            continue
        kind = entry[1]
        # src/mongo/db/pipeline/document_source.cpp (parse): an unknown stage.
        if kind == "stage":
            return _reply(40324, "Location40324", f"Unrecognized pipeline stage name: '{word}'")
        # src/mongo/db/pipeline/variables.cpp: a system variable it does not define.
        if kind == "variable":
            return _reply(17276, "Location17276", f"Use of undefined variable: {word[2:]}")
        # src/mongo/db/pipeline/accumulation_statement.cpp: an unknown accumulator.
        if kind == "accumulator" and context == "$group":
            return _reply(15952, "Location15952", f"unknown group operator '{word}'")
        # src/mongo/db/pipeline/expression.cpp (parseExpression): an unknown expression.
        return _reply(168, "InvalidPipelineOperator", f"Unrecognized expression '{word}'")
    return None


def _update_refusal(q: Any, u: Any, upsert: bool, array_filters: bool) -> dict[str, Any] | None:
    """mongod's answer to one update statement it refuses, else None."""
    if upsert:
        found = _Found()
        _query(q, found)
        # src/mongo/db/query/write_ops/canonical_update.cpp (parseQueryToCQ): an
        # upsert parses its query without the $expr feature, in every version.
        if "$expr" in found.ops:
            return _reply(
                224, "QueryFeatureNotAllowed",
                "$expr is not allowed in the query predicate for an upsert",
            )
    if isinstance(u, list):
        for stage in u:
            if isinstance(stage, Mapping) and stage:
                name = next(iter(stage))
                # The pipeline is parsed before its stages are vetted: a stage the
                # minimum version does not know is unknown before it is misplaced.
                later = LATER.get(name)
                if later is not None and later[0] > MINIMUM and later[1] == "stage":
                    found = _Found()
                    found.stages.append(name)
                    return _later(found, "update")
                # src/mongo/db/update/pipeline_executor.cpp: only the stages that
                # say `isAllowedWithinUpdatePipeline`.
                if name not in UPDATE_STAGES:
                    return _reply(72, "InvalidOptions", f"{name} is not allowed to be used within an update")
        # src/mongo/db/query/write_ops/parsed_update.cpp (parseArrayFilters).
        if array_filters:
            return _reply(9, "FailedToParse", "arrayFilters may not be specified for pipeline-style updates")
        found = _Found()
        _pipeline(u, found)
        return _later(found, "update")
    return None


def _projection_refusal(projection: Any) -> dict[str, Any] | None:
    """A projection that both includes and excludes fields (`_id` aside): the first
    such field sets its kind. src/mongo/db/query/projection_parser.cpp (31253/31254)."""
    if not isinstance(projection, Mapping):
        return None
    kind = None
    for field, value in projection.items():
        if field == "_id":
            continue
        if isinstance(value, bool) or isinstance(value, (int, float)):
            this = "inclusion" if value else "exclusion"
        else:
            this = "inclusion"  # an expression, $slice, $elemMatch, $meta: included
        if kind is None:
            kind = this
        elif this != kind:
            if this == "exclusion":
                return _reply(31254, "Location31254",
                              f"Cannot do exclusion on field {field} in inclusion projection")
            return _reply(31253, "Location31253",
                          f"Cannot do inclusion on field {field} in exclusion projection")
    return None


def _conflict_refusal(u: Any) -> dict[str, Any] | None:
    """A modifier update naming one path twice, or a path and a path inside it:
    src/mongo/db/update/update_object_node.cpp (ConflictingUpdateOperators, 40)."""
    if not _operator_doc(u):
        return None
    seen: list[str] = []
    for fields in u.values():
        if not isinstance(fields, Mapping):
            continue
        for path in fields:
            for earlier in seen:
                if path == earlier or path.startswith(earlier + ".") or earlier.startswith(path + "."):
                    return _reply(40, "ConflictingUpdateOperators",
                                  f"Updating the path '{path}' would create a conflict at "
                                  f"'{min(path, earlier, key=len)}'")
            seen.append(path)
    return None


def _query_refusal(filter_: Any) -> dict[str, Any] | None:
    found = _Found()
    _query(filter_, found)
    return _later(found, "query")


def refusal(cmd: str, doc: Mapping) -> tuple[dict[str, Any] | None, list[int]]:
    """mongod's refusal of `doc`, if it breaks one of the rules above.

    For `update`, mongod refuses statement by statement, as write errors in a reply
    whose `ok` is 1, and applies the others (all of them when unordered, those
    before the first refused one when ordered). The second value is then the
    indexes of the refused statements, and the first their common error; the caller
    runs the rest and merges (see serve.py)."""
    if cmd == "update":
        refused, error = [], None
        for i, st in enumerate(doc.get("updates") or []):
            if not isinstance(st, Mapping):
                continue
            r = (
                _update_refusal(
                    st.get("q"), st.get("u"), bool(st.get("upsert")),
                    st.get("arrayFilters") is not None,
                )
                or _conflict_refusal(st.get("u"))
                or _query_refusal(st.get("q"))
            )
            if r is not None:
                refused.append(i)
                error = error or r
        return error, refused
    if cmd == "findAndModify":
        r = None
        if "update" in doc:
            r = _update_refusal(
                doc.get("query"), doc.get("update"), bool(doc.get("upsert")),
                doc.get("arrayFilters") is not None,
            ) or _conflict_refusal(doc.get("update"))
        r = r or _projection_refusal(doc.get("fields"))
        return (r or _query_refusal(doc.get("query"))), []
    if cmd in ("find", "count", "distinct", "delete"):
        if cmd == "delete":
            for st in doc.get("deletes") or []:
                if isinstance(st, Mapping):
                    r = _query_refusal(st.get("q"))
                    if r is not None:
                        return r, []
            return None, []
        if cmd == "find":
            r = _projection_refusal(doc.get("projection"))
            if r is not None:
                return r, []
        return _query_refusal(doc.get("filter" if cmd == "find" else "query")), []
    if cmd == "aggregate":
        stages = doc.get("pipeline")
        if isinstance(stages, list):
            for stage in stages:
                if isinstance(stage, Mapping) and stage:
                    name, arg = next(iter(stage.items()))
                    if name == "$project":
                        r = _projection_refusal(arg)
                        if r is not None:
                            return r, []
                    found = _Found()
                    _pipeline([stage], found)
                    r = _later(found, "$group" if name == "$group" else "aggregate")
                    if r is not None:
                        return r, []
        return None, []
    return None, []


# === roles ===

#: Actions the dev server's `readWrite` grants and mongod's does not: mongod's
#: readWrite (docs: reference/built-in-roles/#readWrite, source:
#: src/mongo/db/auth/builtin_roles.yml) has no `collMod`, so it cannot set a validator,
#: and no `bypassDocumentValidation` (dbAdmin and restore have them).
NOT_IN_READ_WRITE = frozenset({"collMod", "bypassDocumentValidation"})


def mongod_roles(built_in: dict[str, Any]) -> None:
    """Narrows the dev server's built-in role table to mongod's, in place.

    `built_in` maps a role's name to an object with an `actions` frozenset.
    """
    for name in ("readWrite", "readWriteAnyDatabase"):
        spec = built_in.get(name)
        if spec is not None:
            spec.actions = frozenset(spec.actions) - NOT_IN_READ_WRITE
