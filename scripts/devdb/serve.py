"""The dev server (SecantusDB) behind mongod's rules: what scripts/dev-mongo.sh runs.

    python scripts/devdb/serve.py [--max-connections N] [--shapes-dir DIR]
        [--audited FILE] [--shapes enforce|learn|off] [--report-version X.Y.Z]
        [--rules mongod|off] -- SECANTUS-ARGS...

Before each command reaches the server:

1. `rules.refusal` answers as mongod would a command it refuses and the dev server
   does not (an upsert whose filter holds `$expr`, a `$match` in an update pipeline,
   an operator newer than the oldest MongoDB slotpool supports, ...).
2. Each statement's shape (`rules.shapes`) is looked up in FILE's audited table
   (docs/mongodb.md: every row whose first cell is a shape in backticks). With
   `--shapes enforce` (the default) a shape missing there is refused with a message
   that says so, and written to DIR/unaudited-PORT.tsv; scripts/test.sh fails the run
   when any such file is not empty. `learn` only records; `off` skips the lookup.
   Every shape seen, with the client's appName, goes to DIR/seen-PORT.tsv.

`--rules off` skips step 1: only for a release older than 0.3, whose first
heartbeat mongod refuses (code 224) and which therefore never ran on mongod, when
scripts/upgrade-check.sh upgrades a pool of it in place. Everything else keeps
the rules.

`--max-connections` raises the server's limit of open connections (1,000, which its
command line cannot change; a pool of 200 workers keeps about 850 open).
Its built-in roles are narrowed to mongod's (`rules.mongod_roles`): the dev server's
`readWrite` also grants `collMod` and `bypassDocumentValidation`, which mongod's does
not, so `slotpool init` under `readWrite` alone is refused here as on mongod.

`--report-version` makes `buildInfo` and `hello` name another server version, so
the suite can show what slotpool does on a server older than it supports.
`--report-router` makes `hello` answer as mongos does (`msg: "isdbgrid"`, no replica
set), so the suite can show what a worker does behind mongos.

Every command a `failCommand` failpoint failed (`configureFailPoint`, with
`--enable-test-commands`) is written to DIR/failpoints-PORT.tsv as it happens: the
command, the client's appName, and what it got (an error code, `wce:CODE` for a
writeConcernError, or `closeConnection`). A test reads it to know its failpoint
fired, and how often.

Every read preference other than the primary's that a command carries is written,
with the command and the client's appName, to DIR/readprefs-PORT.tsv: the suite
checks that a URI's `readPreference` sends none of slotpool's reads elsewhere.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
from collections.abc import Mapping
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import rules  # noqa: E402  (beside this file)
import secantus.cli  # noqa: E402
import secantus.commands  # noqa: E402
import secantus.failpoints  # noqa: E402
import secantus.rbac  # noqa: E402
import secantus.server  # noqa: E402

#: What mongod (and the dev server) says of a command a `failCommand` failpoint failed.
FAILPOINT_MESSAGE = "Failing command via 'failCommand' failpoint"

#: Wire versions of the releases `--report-version` may name (the drivers' table).
WIRE = {(4, 2): 8, (4, 4): 9, (5, 0): 13, (6, 0): 17, (7, 0): 21, (8, 0): 25}


#: The heading in docs/mongodb.md under which the audited table stands.
AUDITED_HEADING = "## The audited command shapes"


def audited_shapes(path: str) -> set[str]:
    """Every shape in backticks that opens a table row under AUDITED_HEADING in `path`."""
    out = set()
    with open(path, encoding="utf-8") as f:
        under = False
        for line in f:
            line = line.strip()
            if line.startswith("## "):
                under = line == AUDITED_HEADING
            if not under or not line.startswith("| `"):
                continue
            cell = line[2:].split(" |", 1)[0].strip()
            if cell.startswith("`") and cell.endswith("`") and len(cell) > 2:
                out.add(cell[1:-1].replace("\\|", "|"))
    return out


class Front:
    """mongod's rules and the audited table, in front of SecantusDB's dispatch."""

    def __init__(
        self,
        dispatch,
        mode: str,
        audited_path: str | None,
        shapes_dir: str | None,
        port: int,
        router: bool = False,
        mongod_rules: bool = True,
    ):
        self.dispatch = dispatch
        self.router = router
        self.mongod_rules = mongod_rules
        self.mode = mode
        self.audited_path = audited_path
        self.audited: set[str] = set()
        self.audited_stamp: tuple[int, int, int] | None = None
        self.lock = threading.Lock()
        self.seen: set[tuple[str, str]] = set()
        self.seen_file = self.unaudited_file = self.readprefs_file = None
        self.failpoints_file = None
        if shapes_dir:
            os.makedirs(shapes_dir, exist_ok=True)
            self.seen_file = os.path.join(shapes_dir, f"seen-{port}.tsv")
            self.unaudited_file = os.path.join(shapes_dir, f"unaudited-{port}.tsv")
            self.readprefs_file = os.path.join(shapes_dir, f"readprefs-{port}.tsv")
            self.failpoints_file = os.path.join(shapes_dir, f"failpoints-{port}.tsv")
        self.readprefs: set[tuple[str, str, str]] = set()

    def __call__(self, doc: dict[str, Any], ctx) -> dict[str, Any]:
        cmd = secantus.commands.command_name(doc)
        self.note_read_preference(cmd, doc, ctx)
        if self.router and cmd in ("hello", "isMaster", "ismaster"):
            return as_router(self.dispatch(doc, ctx))
        error, refused = rules.refusal(cmd, doc) if self.mongod_rules else (None, None)
        if error is not None:
            if cmd == "update" and refused:
                return self.partly(doc, ctx, error, refused)
            return error
        if self.mode != "off":
            missing = self.note(cmd, doc, ctx)
            if missing is not None and self.mode == "enforce":
                return {
                    "ok": 0.0,
                    "code": 2,
                    "codeName": "BadValue",
                    "errmsg": (
                        "slotpool's dev server refuses a command shape that "
                        f"docs/mongodb.md has not audited: {missing} -- check it against "
                        "mongod's rules and add its row to the table (docs/mongodb.md, "
                        "'Keeping the table true')"
                    ),
                }
        try:
            reply = self.dispatch(doc, ctx)
        except secantus.failpoints.CloseConnectionRequested:
            self.failed_by_failpoint(cmd, ctx, doc, "closeConnection")
            raise
        if cmd.lower() == "buildinfo" and isinstance(reply, dict):
            # Says a client meets the rules front, and the release whose rules it
            # keeps (tests/mongod_rules.rs: a newer mongod knows what 6.0 does not).
            reply["slotpoolRulesFront"] = ".".join(map(str, rules.MINIMUM))
        if isinstance(reply, Mapping):
            if reply.get("errmsg") == FAILPOINT_MESSAGE:
                self.failed_by_failpoint(cmd, ctx, doc, str(reply.get("code")))
            wce = reply.get("writeConcernError")
            if isinstance(wce, Mapping):
                self.failed_by_failpoint(cmd, ctx, doc, f"wce:{wce.get('code')}")
        return reply

    def failed_by_failpoint(self, cmd: str, ctx, doc: Mapping, what: str) -> None:
        app = secantus.commands._failpoint_app_name(cmd, doc, ctx) or "-"
        with self.lock:
            self.append(self.failpoints_file, f"{cmd}\t{app}\t{what}\n")

    def audited_table(self) -> set[str]:
        """The audited shapes, read again whenever the file changes (a row added
        while the demo's or a test run's server keeps running counts at once)."""
        if self.audited_path is None:
            return self.audited
        try:
            st = os.stat(self.audited_path)
        except OSError:
            return self.audited
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        if stamp != self.audited_stamp:
            with self.lock:
                if stamp != self.audited_stamp:
                    try:
                        table = audited_shapes(self.audited_path)
                    except (OSError, UnicodeDecodeError) as e:
                        print(f"serve.py: cannot read {self.audited_path}: {e}", file=sys.stderr)
                        table = set()
                    # A file caught half-written (an editor's save, a checkout)
                    # reads short: keep the table we had until it reads whole.
                    if table or not self.audited:
                        self.audited = table
                        self.audited_stamp = stamp
        return self.audited

    def note(self, cmd: str, doc: Mapping, ctx) -> str | None:
        """Records the command's shapes; returns the first one not audited."""
        app = secantus.commands._failpoint_app_name(cmd, doc, ctx) or "-"
        missing = None
        table = self.audited_table()
        for shape in rules.shapes(cmd, doc):
            audited = shape in table
            if not audited and missing is None:
                missing = shape
            key = (shape, app)
            if key in self.seen:
                continue
            with self.lock:
                if key in self.seen:
                    continue
                self.seen.add(key)
                self.append(self.seen_file, f"{shape}\t{app}\n")
                if not audited:
                    self.append(self.unaudited_file, f"{shape}\t{app}\n")
        return missing

    def note_read_preference(self, cmd: str, doc: Mapping, ctx) -> None:
        pref = doc.get("$readPreference")
        mode = pref.get("mode") if isinstance(pref, Mapping) else None
        if not isinstance(mode, str) or mode in ("primary", "primaryPreferred"):
            return
        app = secantus.commands._failpoint_app_name(cmd, doc, ctx) or "-"
        key = (cmd, mode, app)
        if key in self.readprefs:
            return
        with self.lock:
            if key not in self.readprefs:
                self.readprefs.add(key)
                self.append(self.readprefs_file, f"{cmd}\t{mode}\t{app}\n")

    @staticmethod
    def append(path: str | None, line: str) -> None:
        """Appends a record line; the directory is made again if someone removed it
        (`rm -rf .state/shapes` under a running demo), and a record that cannot be
        written is reported, never the command's failure."""
        if path is None:
            return
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "a", encoding="utf-8") as f:
                f.write(line)
        except OSError as e:
            print(f"serve.py: cannot record to {path}: {e}", file=sys.stderr)

    def partly(self, doc: dict[str, Any], ctx, error: dict[str, Any], refused: list[int]):
        """An update some of whose statements mongod refuses: the others run (all of
        them when unordered, those before the first refused one when ordered), and the
        refused ones come back as write errors in a reply whose `ok` is 1."""
        statements = doc.get("updates") or []
        ordered = doc.get("ordered", True) is not False
        if ordered:
            keep = list(range(refused[0]))
            refused = refused[:1]
        else:
            keep = [i for i in range(len(statements)) if i not in set(refused)]
        reply: dict[str, Any] = {"n": 0, "nModified": 0, "ok": 1.0}
        if keep:
            sub = dict(doc)
            sub["updates"] = [statements[i] for i in keep]
            reply = dict(self(sub, ctx))
            if reply.get("ok") != 1:
                return reply
        errors = [dict(e, index=keep[e["index"]]) for e in reply.get("writeErrors", [])]
        if "upserted" in reply:
            reply["upserted"] = [dict(u, index=keep[u["index"]]) for u in reply["upserted"]]
        if not (ordered and errors):
            errors += [{"index": i, "code": error["code"], "errmsg": error["errmsg"]} for i in refused]
        reply["writeErrors"] = sorted(errors, key=lambda e: e["index"])
        return reply


#: What a replica set member's `hello` says and mongos's does not.
REPLICA_SET_FIELDS = (
    "setName", "setVersion", "hosts", "passives", "arbiters", "primary", "me",
    "secondary", "electionId", "lastWrite", "isreplicaset",
)


def as_router(reply: dict[str, Any]) -> dict[str, Any]:
    """A `hello` reply as mongos gives it."""
    if reply.get("ok") != 1:
        return reply
    out = {k: v for k, v in reply.items() if k not in REPLICA_SET_FIELDS}
    out["msg"] = "isdbgrid"
    return out


def report_version(text: str) -> None:
    parts = [int(p) for p in text.split(".")]
    while len(parts) < 4:
        parts.append(0)
    secantus.commands.SERVER_VERSION = ".".join(str(p) for p in parts[:3])
    secantus.commands.SERVER_VERSION_ARRAY = parts
    wire = WIRE.get((parts[0], parts[1]))
    if wire is not None:
        secantus.commands.WIRE_VERSION = wire


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max-connections", type=int)
    parser.add_argument("--shapes-dir")
    parser.add_argument("--audited")
    parser.add_argument("--shapes", choices=["enforce", "learn", "off"], default="enforce")
    parser.add_argument("--report-version")
    parser.add_argument("--report-router", action="store_true")
    parser.add_argument("--rules", choices=["mongod", "off"], default="mongod")
    parser.add_argument("server", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    server_args = args.server[1:] if args.server[:1] == ["--"] else args.server

    if args.max_connections:
        start = secantus.server.SecantusDBServer.__init__

        def with_limit(self, *a, **kw):
            kw.setdefault("max_connections", args.max_connections)
            start(self, *a, **kw)

        secantus.server.SecantusDBServer.__init__ = with_limit
    if args.report_version:
        report_version(args.report_version)
    rules.mongod_roles(secantus.rbac.BUILT_IN_ROLES)

    mode = args.shapes
    if mode != "off":
        if not args.audited:
            parser.error("--audited FILE is needed unless --shapes off")
        audited_shapes(args.audited)  # readable, before the server starts
    port = 0
    if "--port" in server_args:
        port = int(server_args[server_args.index("--port") + 1])
    secantus.server.dispatch = Front(
        secantus.server.dispatch,
        mode,
        args.audited if mode != "off" else None,
        args.shapes_dir,
        port,
        args.report_router,
        args.rules == "mongod",
    )
    sys.argv = ["secantusd-py", *server_args]
    return secantus.cli.main()


if __name__ == "__main__":
    sys.exit(main())
